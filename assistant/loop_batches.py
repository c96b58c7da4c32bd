"""Round trips from the event loop, in batches: what is asked for while a batch is on its way goes
together in the next, one round trip (``assistant/loop_redis.py``'s commands to Redis,
``assistant/loop_postgres.py``'s reads from PostgreSQL).

On a busy loop a reply waits for the loop's turn however fast the server is, so requests sent one
by one on a few connections queue for a connection behind the loop's turns (at a thousand
students, the give-backs of their stream slots waited seconds); a batch takes whatever waits, on
one connection, and the busier the loop the more each round trip carries.
"""

import asyncio
from collections.abc import Sequence


class LoopBatches[Asked, Found]:
    """Requests to one server from the event loop: ``ask`` queues one; those queued while a batch
    is on its way go in the next, which ``_send`` sends in one round trip."""

    def __init__(self) -> None:
        self._queued: list[tuple[Asked, asyncio.Future[Found]]] = []
        self._sending: asyncio.Task[None] | None = None

    def ask(self, asked: Asked) -> "asyncio.Future[Found]":
        """Queue ``asked``; its answer, or the error the server or the connection gave, comes in
        the future."""
        loop = asyncio.get_running_loop()
        found: asyncio.Future[Found] = loop.create_future()
        self._queued.append((asked, found))
        if self._sending is None:
            self._sending = loop.create_task(self._batches())
        return found

    async def _send(self, batch: list[Asked]) -> Sequence[Found | Exception]:
        """One batch's answers, one per request (an ``Exception`` for a request that failed on
        its own), within ``_within_s`` seconds, its connection opened included; raises when
        the whole batch failed (the connection, or the time), and the connection is dropped, to
        be opened again for the next batch."""
        try:
            async with asyncio.timeout(self._within_s()):
                return await self._round_trip(batch)
        except BaseException:
            await self._drop()
            raise

    def _within_s(self) -> float:
        """How long a batch may take: a server that stopped answering holds nobody longer."""
        raise NotImplementedError

    async def _round_trip(self, batch: list[Asked]) -> Sequence[Found | Exception]:
        """One batch sent and answered, on the connection (opened first if need be)."""
        raise NotImplementedError

    async def _drop(self) -> None:
        """Close the connection, if one is open; the next batch opens another."""
        raise NotImplementedError

    async def _batches(self) -> None:
        batch: list[tuple[Asked, asyncio.Future[Found]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                try:
                    answers = await self._send([asked for asked, _ in batch])
                except Exception as error:  # the connection: every request of the batch failed
                    answers = [error] * len(batch)
                for (_, found), answer in zip(batch, answers, strict=True):
                    if found.done():  # its caller stopped waiting
                        continue
                    if isinstance(answer, Exception):
                        found.set_exception(answer)
                    else:
                        found.set_result(answer)
        except BaseException:  # cancelled (the loop is ending): nobody is left waiting forever
            for _, found in [*batch, *self._queued]:
                found.cancel()
            self._queued = []
            raise
        finally:
            self._sending = None

    async def _sent(self, within_s: float) -> None:
        """Wait for the batch on its way, if any, at most ``within_s``."""
        sending = self._sending
        if sending is not None:
            await asyncio.wait({sending}, timeout=within_s)
