"""An engine's deltas for one answer, each waited for within a limit that can be cut short.

The wait for the next delta is where an answer spends its time, so it is where an early end
(a seat given up, Stop, a dropped reader) must reach it: ``cut_short`` ends the wait in
progress at once, with no task per delta and nothing cancelled from outside.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

from assistant.engines import Delta


@dataclass(eq=False, slots=True)
class EngineStream:
    deltas: AsyncIterator[Delta]
    #: The first delta, already asked for while the session was looked up.
    pending: asyncio.Future[Delta] | None = None
    #: The limit on the wait in progress, if one is.
    _deadline: asyncio.Timeout | None = None

    def _step(self) -> Awaitable[Delta]:
        """The delta already asked for, else a plain ``anext`` (cancelling the caller cancels
        the engine's step too)."""
        pending, self.pending = self.pending, None
        return pending if pending is not None else anext(self.deltas)

    async def next(self, limit: float) -> Delta:
        """The engine's next delta. ``StopAsyncIteration`` at its end; ``TimeoutError`` after
        ``limit`` seconds, or at once when ``cut_short`` is called meanwhile."""
        try:
            async with asyncio.timeout(limit) as self._deadline:
                return await self._step()
        finally:
            self._deadline = None  # it holds the waiting task

    def cut_short(self) -> None:
        """End the wait in progress, if any, now."""
        deadline = self._deadline
        if deadline is not None and not deadline.expired():
            deadline.reschedule(asyncio.get_running_loop().time())

    async def close(self) -> None:
        """Stop the engine: cancel its step in flight, if any, then close its stream (the engine
        contract makes that stop generation upstream)."""
        pending = self.pending
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await self.deltas.aclose()  # type: ignore[attr-defined]
