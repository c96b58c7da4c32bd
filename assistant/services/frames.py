"""The frames of an answer, encoded on top of ``assistant.sse``, and keeping a quiet stream alive.

Every frame an answer sends is built here, so its wire format is read in one place; the
``Heartbeat`` pings beside an answer's live listener (``services/answer.py``; listeners that read
the answer's buffer ping from their wait instead).
"""

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from django.utils.functional import Promise

from assistant import conf, sse

OPEN = sse.encode_comment("open")
PING = sse.encode_comment("ping")


class Frames:
    """How an answer's frames are written: the page's events (``meta``, ``token``, ``done``,
    ``error``, ``queue``; docs/protocol.md). Another wire format (``services/openai_wire.py``)
    overrides these; an empty frame is not sent. Pings are the same comment in every format."""

    def open(self) -> bytes:
        return OPEN

    def meta(
        self,
        *,
        request_id: str,
        conversation_id: uuid.UUID,
        message_id: uuid.UUID,
        user_message_id: uuid.UUID,
        serving_path: str,
        engine: str,
    ) -> bytes:
        """Which answer this is: the first event of every stream (and of every resume)."""
        return sse.encode_json_event(
            {
                "request_id": request_id,
                "conversation": str(conversation_id),
                "message": str(message_id),
                "user_message": str(user_message_id),
                "path": serving_path,
                "engine": engine,
            },
            event="meta",
        )

    def token(self, text: str, token_id: int) -> bytes:
        """One piece of the answer; ``token_id`` counts from 1 and is what a resume names."""
        return sse.encode_token_event(text, token_id)

    def queue(self, position: int) -> bytes:
        """Where the request stands in the engine's queue (1: next)."""
        return sse.encode_json_event({"position": position}, event="queue")

    def done(
        self,
        *,
        finish_reason: str,
        tokens: int,
        timings: dict[str, float | int | None],
        usage: tuple[int | None, int | None],
    ) -> bytes:
        """The last frame of an answer that ended well; ``usage``: the prompt's and the
        answer's lengths in tokens where the engine told them (not part of this format)."""
        return sse.encode_json_event(
            {"finish_reason": finish_reason, "tokens": tokens, "timings": timings}, event="done"
        )

    def error(self, code: str, message: str | Promise) -> bytes:
        """The ``error`` event that ends a stream; ``message`` is made text in the active
        language."""
        return sse.encode_json_event({"code": code, "message": str(message)}, event="error")

    def server_error(self) -> bytes:
        """The last frame of a stream the server itself broke."""
        return self.error("server_error", "The server failed while answering.")


SITE_FRAMES = Frames()


class Heartbeat:
    """Sends ``: ping`` whenever nothing was sent for ``interval`` seconds, from ``start()`` to
    ``stop()``.

    One timer per stream, not a task: it fires only when the stream may have been silent for
    ``interval``, and a ping that is due goes out from a task of its own, beside the frame loop
    (as sse-starlette's ping task does). The per-frame cost is one clock read (``beat``); an
    answer that is never silent that long costs one timer made and cancelled, where a task
    asleep beside it cost its making, its first step and the step that ends it.
    """

    def __init__(self, send: Callable[[bytes], Awaitable[None]], interval: float) -> None:
        self.send = send
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._pinging: asyncio.Task[None] | None = None
        self._stopped = False

    def beat(self) -> None:
        self.last = self.loop.time()

    def start(self) -> None:
        self._timer = self.loop.call_at(self.last + self.interval, self._due)

    def stop(self) -> None:
        """No ping from now on; one being sent is cancelled."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pinging is not None:
            self._pinging.cancel()
            self._pinging = None

    def _due(self) -> None:
        self._timer = None
        if self.loop.time() < self.last + self.interval:
            self.start()  # a frame went out meanwhile: silent from then on
        else:
            self._pinging = self.loop.create_task(self._ping())

    async def _ping(self) -> None:
        await self.send(PING)
        self.beat()
        self._pinging = None
        if not self._stopped:
            self.start()


def ping_interval() -> float:
    return float(conf.settings.CHATSITE_STREAM["PING_INTERVAL"])
