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
    """The deltas of one answer. Each wait has its own limit, but the stream arms one timer for
    them all, set for the earliest deadline it has to watch: a delta that comes in time moves
    only the deadline (a float), and the timer, when it fires before the deadline in force,
    arms itself again for it. An answer's 20 tokens cost one timer, not 20 (as
    ``asyncio.timeout`` per wait would: a timer made and cancelled for each)."""

    deltas: AsyncIterator[Delta]
    #: The first delta, already asked for while the session was looked up.
    pending: asyncio.Future[Delta] | None = None
    #: The task waiting for a delta now, and the loop time its wait ends.
    _waiter: asyncio.Task[object] | None = None
    _deadline: float = 0.0
    #: Its ``cancelling()`` count when the wait began: a cancel of ours comes on top.
    _cancelling: int = 0
    #: The wait in progress was ended by its limit or ``cut_short``, not from outside.
    _expired: bool = False
    _timer: asyncio.TimerHandle | None = None

    def _step(self) -> Awaitable[Delta]:
        """The delta already asked for, else a plain ``anext`` (cancelling the caller cancels
        the engine's step too)."""
        pending, self.pending = self.pending, None
        return pending if pending is not None else anext(self.deltas)

    async def next(self, limit: float) -> Delta:
        """The engine's next delta. ``StopAsyncIteration`` at its end; ``TimeoutError`` after
        ``limit`` seconds, or at once when ``cut_short`` is called meanwhile."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("EngineStream.next runs in a task")
        loop = task.get_loop()
        self._deadline = deadline = loop.time() + limit
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._check)
        self._waiter, self._cancelling, self._expired = task, task.cancelling(), False
        try:
            return await self._step()
        except asyncio.CancelledError:
            if self._expired and task.uncancel() <= self._cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._waiter = None  # it holds the waiting task

    def _check(self) -> None:
        """The timer: end the wait in progress if its deadline has come, else wait for it."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or self._expired:
            return  # no wait now: the next one arms a timer
        loop = waiter.get_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._check)
            return
        self._expire(waiter)

    def _expire(self, waiter: asyncio.Task[object]) -> None:
        self._expired = True
        waiter.cancel()

    def cut_short(self) -> None:
        """End the wait in progress, if any, now."""
        waiter = self._waiter
        if waiter is not None and not self._expired:
            self._expire(waiter)

    async def close(self) -> None:
        """Stop the engine: cancel its step in flight, if any, then close its stream (the engine
        contract makes that stop generation upstream)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        pending = self.pending
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await self.deltas.aclose()  # type: ignore[attr-defined]
