"""The frames of a chat stream that are not the engine's words, and keeping a quiet stream alive.

Encoding on top of ``assistant.sse``, and the ``Heartbeat`` that pings beside a loop of sends
(the Channels consumer; a resumable stream's listeners ping from its buffer instead).
"""

import asyncio
from collections.abc import Awaitable, Callable

from django.conf import settings

from assistant import sse


def error_frame(code: str, message: str) -> bytes:
    return sse.encode_json_event({"code": code, "message": message}, event="error")


def queue_frame(position: int) -> bytes:
    """Where the request stands in the engine's queue (1: next)."""
    return sse.encode_json_event({"position": position}, event="queue")


def server_error_frame() -> bytes:
    """The last frame of a stream the server itself broke."""
    return error_frame("server_error", "The server failed while answering.")


class Heartbeat:
    """Sends ``: ping`` whenever nothing was sent for ``interval`` seconds.

    One timer per stream, which wakes only when the stream has been silent; the per-frame cost
    is one clock read (``beat``). Runs beside the frame loop, as sse-starlette's ping task does.
    """

    def __init__(self, send: Callable[[bytes], Awaitable[None]], interval: float) -> None:
        self.send = send
        self.interval = interval
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()

    def beat(self) -> None:
        self.last = self.loop.time()

    async def run(self) -> None:
        while True:
            delay = self.last + self.interval - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            await self.send(PING)
            self.beat()


PING = sse.encode_comment("ping")


def ping_interval() -> float:
    return float(settings.CHATSITE_STREAM["PING_INTERVAL"])
