"""The frames of a chat stream that are not the engine's words, and keeping a quiet stream alive.

Encoding on top of ``assistant.sse``, plus the two ways pings are sent: a ``Heartbeat`` task
beside a loop of sends (the Channels consumer), or ``frames_with_pings`` merged into one iterator
(a Django streaming response).
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

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


async def frames_with_pings(frames: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """``frames`` with ``: ping`` whenever nothing came for ``interval`` seconds, as one iterator
    (for a response that is an iterator, such as Django's ``StreamingHttpResponse``).

    One task per stream pulls the frames into a one-slot queue; the reader waits on the queue
    with a timeout, which never interrupts the engine. Closing this iterator stops the puller.
    """
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=1)

    async def pull() -> None:
        try:
            async with aclosing(frames) as source:  # type: ignore[type-var]
                async for frame in source:
                    await queue.put(frame)
        except Exception as exc:
            await queue.put(exc)
            return
        await queue.put(None)

    puller = asyncio.create_task(pull())
    try:
        while True:
            try:
                async with asyncio.timeout(interval):
                    item = await queue.get()
            except TimeoutError:
                yield PING
                continue
            if item is None:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if not puller.done():
            puller.cancel()
        await asyncio.wait({puller})
