"""One answer, from a started engine to its stored record: the runner both serving paths share.

An ``Answer`` (made by ``services/answer_open.py``) owns everything about one answer: the
engine's stream, the frames, the buffer a resume reads (``AnswerBuffer``), the pings, the check
for a client that stopped reading, the outcome, the student's stream slot and seat, what is
stored and what is measured. Transports use four calls and never write its state:

* ``run(live=send, end=send_last)``: generate the answer to its end in the caller's task, each
  frame sent to ``live`` the moment it exists (no task switch or queue between the engine and
  the socket), the last one once the answer is closed, to ``end``, which ends the response with
  it. The ``direct`` path does this: its consumer owns its task.
* ``listen(last_id)``: the answer's frames from its buffer, as an async iterator: a resume, and
  the ``django`` path's response (Django cancels a response's iteration on a disconnect, so there
  the answer runs in a task of its own: ``run_apart()``).
* ``detach()``: the live listener's client is gone; the answer goes on for the resume grace.
* ``stop()``: end it now (the student pressed Stop); ``preempt()`` only if nobody listens.

Every early end (a seat given up, a client that stopped reading, Stop) is one request that the
frame loop acts on at its next step, cutting short the wait for the engine: nothing is
cancelled from outside, so what was said is always stored.

This module holds the transports' calls and the frame loop; how the answer ends (its outcome,
its last frame, the slot given back, what is stored and measured) is ``AnswerEnd``, in
``services/answer_close.py``.
"""

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from django.conf import settings

from assistant import conf
from assistant.engines import BaseEngine, EngineError, EngineTimeout
from assistant.models import StreamRecord
from assistant.services import background
from assistant.services.answer_buffer import AnswerBuffer
from assistant.services.answer_close import AnswerEnd
from assistant.services.answer_ends import SLOW_CLIENT, STOPPED, EarlyEnd, Ended, given_up
from assistant.services.answer_registry import answer_forget, answer_register
from assistant.services.conversations import Exchange
from assistant.services.engine_stream import EngineStream
from assistant.services.frames import SITE_FRAMES, Frames, Heartbeat, ping_interval
from assistant.services.identity import Identity
from assistant.services.seats import Seat
from assistant.services.timings import StreamTimings, now
from assistant.transport import ClientConnection, UnreadWatch

logger = logging.getLogger(__name__)

Outcome = StreamRecord.Outcome
Send = Callable[[bytes], Awaitable[None]]

#: Half of a UTF-16 pair without the other: not encodable, shown as U+FFFD instead.
_UNPAIRED = re.compile("[\ud800-\udfff]")


@dataclass(slots=True)
class _Live:
    """The listener that hears frames as they are produced: the response that asked."""

    send: Send
    #: Sends the last frame and ends the response with it, in one write (None: ``send``).
    end: Send | None
    heartbeat: Heartbeat


@dataclass(eq=False)
class Answer(AnswerEnd):
    """One running answer; see the module docstring for how transports use it."""

    exchange: Exchange
    identity: Identity
    question: str
    serving_path: str
    engine: BaseEngine
    source: EngineStream
    timings: StreamTimings
    #: Its place on the engine, given back when it ends.
    seat: Seat
    #: The wire format of its frames: the page's events, or OpenAI's chunks.
    frames: Frames = SITE_FRAMES
    #: Whether it holds one of its owner's stream slots (an API key's answers hold none).
    holds_slot: bool = True
    #: Whether a client may resume it (the page's may; no API client does: it is not kept).
    resumable: bool = True
    outcome: Outcome = Outcome.CLIENT_ABORT
    #: Why it ended early: an engine's or the error catalogue's code ("" when it did not).
    error_code: str = ""
    #: The engine's own finish reason (stop, length, ...).
    finish_reason: str = ""
    #: The prompt's and the answer's lengths in tokens, where the engine tells them.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: list[str] = field(default_factory=list)
    buffer: AnswerBuffer = field(init=False)
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    _end: EarlyEnd | None = None
    _live: _Live | None = None
    #: The connection of the listener that asked (live, or reading the buffer), while it
    #: listens: checked for a client that stopped reading as frames are produced.
    _reader: UnreadWatch | None = None
    _task: asyncio.Task[None] | None = None
    _question_stored: bool = False
    _slot_released: bool = False
    _closed: bool = False

    def __post_init__(self) -> None:
        self._slot_released = not self.holds_slot
        self.buffer = AnswerBuffer(
            request_id=self.request_id, unheard=self.preempt, contended=self.engine.contended
        )
        self.seat.give_up = self.give_up
        self.seat.unheard = lambda: self.buffer.abandoned
        self.resumable = self.resumable and conf.settings.CHATSITE_STREAM["RESUME_GRACE_S"] > 0
        answer_register(self, resumable=self.resumable)

    @property
    def request_id(self) -> str:
        return self.exchange.request_id

    @property
    def owner_key(self) -> str:
        return self.identity.owner_key

    @property
    def finished(self) -> bool:
        return self.buffer.finished

    @property
    def abandoned(self) -> bool:
        return self.buffer.abandoned

    @property
    def complete(self) -> bool:
        return self.buffer.complete

    # --- what transports call -------------------------------------------------------------

    async def run(
        self,
        *,
        live: Send | None = None,
        end: Send | None = None,
        connection: ClientConnection | None = None,
    ) -> None:
        """Generate the answer to its end in this task. ``live`` (the response that asked)
        gets each frame as it is produced until ``detach()``; ``connection`` is its socket, for
        the slow-reader check. Cancelling this ends the answer (it is still stored).

        The last frame (``done`` or ``error``) goes out once the answer is closed: the engine
        stopped, what was said on its way to the database, the metrics counted and the log
        line written, so a client that has it finds them. ``end``, when given, sends it in
        place of ``live`` and ends the response with it, in one write."""
        self._task = task = asyncio.current_task()
        if task is not None:
            background.adopt(task)  # stopped and stored first when the process shuts down
        if live is not None:
            self.buffer.attach()
            heartbeat = Heartbeat(live, ping_interval())
            heartbeat.start()
            self._live = _Live(live, end, heartbeat)
            self._reader = _watch(connection)
        last = b""
        try:
            last = await self._generate()
        finally:
            try:
                await self._close()
                await self._deliver_last(last)
            finally:
                self._live = None
                self._finish()

    def run_apart(self, *, connection: ClientConnection | None = None) -> None:
        """``run()`` in a task of its own, held until done, for a transport whose response
        reads the answer with ``listen(asker=True)`` on ``connection``."""
        if connection is not None:
            # Frames waiting in the buffer are unread by this client too: a reader that stalls
            # is noticed while the answer is still being generated, not only where it reads.
            self._reader = _watch(connection.behind(self.buffer.unread))
        background.spawn(self.run(), name=f"answer:{self.request_id}")

    async def listen(self, last_id: int = 0, *, asker: bool = False) -> AsyncIterator[bytes]:
        """``: open``, ``meta``, every frame after token ``last_id``, then new frames as they
        come (``: ping`` when quiet) until the answer ends. The ``asker`` (the response of the
        request that started it) is dropped, and the answer ended, if it leaves too much unread."""
        self.buffer.attach()
        reader = self._reader if asker else None
        try:
            async for frame in self.buffer.frames_after(last_id, ping_interval()):
                yield frame
                if reader is not None and self._fell_behind(reader):
                    return
        finally:
            if reader is not None and self._reader is reader:
                self._reader = None
            self.buffer.detach()

    def detach(self) -> None:
        """The live listener's client is gone: nothing more is sent to it, and the answer goes
        on (in the same task, held by ``background``) for the resume grace, into its buffer
        only."""
        self._drop_live()

    def stop(self) -> None:
        """End the answer now, listened to or not; a resume then gets the stored answer."""
        if self.finished:
            return
        self.buffer.cancel_grace()
        answer_forget(self)
        self._end_early(STOPPED)

    def preempt(self) -> None:
        """``stop()``, if nobody listens (the grace ran out, or another request waits)."""
        if self.buffer.listeners == 0:
            self.stop()

    def give_up(self, reason: str) -> None:
        """End the answer with an ``error`` event for ``reason``: its seat went to another
        request (``seats.UNHEARD``, ``seats.FAIR_SHARE``)."""
        self._end_early(given_up(reason))

    # --- inside ---------------------------------------------------------------------------

    def _end_early(self, end: EarlyEnd) -> None:
        """Ask the frame loop to end with ``end`` at its next step; the wait for the engine's
        next delta ends at once. A frame being sent goes first."""
        if self._end is None and not self._closed:
            self._end = end
            self.source.cut_short()

    def _drop_live(self) -> None:
        """Send nothing more to the live listener: its client is gone, or was dropped."""
        live, self._live = self._live, None
        if live is None:
            return
        live.heartbeat.stop()
        self._reader = None
        self.buffer.detach()

    def _fell_behind(self, reader: UnreadWatch) -> bool:
        """Whether ``reader``'s client has more of the answer unread than allowed; then it is
        dropped (with whatever is still buffered for it) and the answer ended."""
        unsent = reader.over()
        if unsent is None:
            return False
        logger.warning(
            "Dropped a client that stopped reading %s: %d bytes unread", self.request_id, unsent
        )
        reader.connection.abort()
        self._end_early(SLOW_CLIENT)
        return True

    async def _deliver(self, token_id: int | None, frame: bytes) -> None:
        if not frame:
            return  # nothing in this wire format
        self.buffer.keep(token_id, frame)
        live = self._live
        if live is not None:
            await live.send(frame)
            live.heartbeat.beat()
            self.buffer.sent()
        reader = self._reader
        if reader is not None:
            reader.produced(len(frame))
            if token_id is not None and self._fell_behind(reader):
                self._drop_live()

    async def _deliver_last(self, frame: bytes) -> None:
        """The last frame, kept, and sent to the live listener if it is still there, with the
        end of its response when it has an ``end``."""
        if not frame:
            return
        self.buffer.keep(None, frame)
        live = self._live
        if live is not None:
            await (live.end or live.send)(frame)
            self.buffer.sent()

    async def _generate(self) -> bytes:
        """Deliver ``: open`` with ``meta``, then each token the moment the engine makes it; returns
        the answer's last frame (``done`` or ``error``; empty when it has none).

        One loop for every token, with the engine's wait in it, and nothing between the
        engine's stream and ``_deliver``: a token costs one step of this coroutine and one of
        ``EngineStream.next``. What the engine, the frames or the end raise is the answer's
        failure (recorded, logged, an ``error`` frame); what delivering raises is not caught
        here (the transport's, and the answer is still stored by ``run``)."""
        frames, source, timings, deliver = self.frames, self.source, self.timings, self._deliver
        config = conf.settings.CHATSITE_STREAM
        first_limit, next_limit = config["FIRST_TOKEN_TIMEOUT"], config["TOKEN_TIMEOUT"]
        try:
            meta = self._meta()
        except Exception:
            await deliver(None, frames.open())
            return self._crashed(record=True)
        # ``: open`` and ``meta`` as one frame: one write to the socket, not two.
        await deliver(None, frames.open() + meta)
        ending: EngineError | Ended | None = None
        while True:
            try:
                if self._end is not None:
                    raise Ended(self._end)
                limit = next_limit if timings.tokens else first_limit
                try:
                    delta = await source.next(limit)
                except TimeoutError:
                    raise self._wait_failed(limit) from None
                if delta.queue_position is not None:
                    token_id, frame = None, frames.queue(delta.queue_position)
                else:
                    if delta.prompt_tokens is not None:
                        self.prompt_tokens = delta.prompt_tokens
                    if delta.completion_tokens is not None:
                        self.completion_tokens = delta.completion_tokens
                    if delta.finish_reason:
                        self.finish_reason = delta.finish_reason
                    if not delta.text:
                        continue
                    if not timings.tokens:
                        timings.engine_first_delta = now()
                    text = _UNPAIRED.sub("\ufffd", delta.text)
                    self.text.append(text)
                    token_id = timings.tokens + 1
                    frame = frames.token(text, token_id)
            except StopAsyncIteration:
                break
            except (EngineError, Ended) as exc:
                ending = exc
                break
            except Exception:
                return self._crashed(record=True)
            await deliver(token_id, frame)
            if token_id is not None:  # a token: sent now
                timings.token_sent(now())
                self._save_question()
        try:
            return await self._last_frame(ending)
        except Exception:
            # A failure after the engine's is not recorded over it.
            return self._crashed(record=ending is None)

    def _wait_failed(self, limit: float) -> Ended | EngineTimeout:
        """Why the wait for the engine's next delta ended before it came: an early end cut it
        short, or the engine took longer than ``limit`` s."""
        if self._end is not None:
            return Ended(self._end)
        stage = "token" if self.timings.tokens else "first_token"
        return EngineTimeout(f"no {stage} within {limit:g} s", code=f"{stage}_timeout")

    def _crashed(self, *, record: bool) -> bytes:
        """The server failed while answering: logged, recorded as its outcome (``record``), and
        told in the stream's last frame."""
        logger.exception("Answer %s crashed", self.request_id)
        if record:
            self._ended(Outcome.SERVER_ERROR, "server_error")
        return self.frames.server_error()

    def _meta(self) -> bytes:
        exchange = self.exchange
        return self.frames.meta(
            request_id=exchange.request_id,
            conversation_id=exchange.conversation_id,
            message_id=exchange.answer_message_id,
            user_message_id=exchange.user_message_id,
            serving_path=self.serving_path,
            engine=self.engine.name,
        )


def _watch(connection: ClientConnection | None) -> UnreadWatch | None:
    """The check for a client that stopped reading, on ``connection`` (None: a server whose
    connection is not found, no check)."""
    if connection is None:
        return None
    return UnreadWatch(connection, settings.CHATSITE_STREAM["MAX_UNSENT_BYTES"])
