"""An engine's deltas, each within a limit, on one timer per answer (services/engine_stream.py).

The engines here are plain async generators that wait on events the test sets: no clock is
raced, and every limit that must not expire is an hour.
"""

import asyncio
from collections.abc import AsyncIterator

import pytest

from assistant.engines import Delta
from assistant.services.engine_stream import EngineStream

HOUR = 3600.0


class Engine:
    """Yields one delta each time ``release()`` is called; notes when it is closed."""

    def __init__(self) -> None:
        self.go = asyncio.Queue[str]()
        self.closed = False
        self.cancelled = False

    def release(self, text: str = "x") -> None:
        self.go.put_nowait(text)

    async def deltas(self) -> AsyncIterator[Delta]:
        try:
            while True:
                yield Delta(await self.go.get())
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


async def test_deltas_that_come_in_time_are_returned_on_one_timer() -> None:
    engine = Engine()
    stream = EngineStream(engine.deltas())
    timers = set()
    for n in range(5):
        engine.release(f"t{n}")
        assert (await stream.next(HOUR)).text == f"t{n}"
        timers.add(id(stream._timer))
    assert len(timers) == 1  # armed once, for the first deadline; later ones are further off
    await stream.close()
    assert engine.closed and stream._timer is None


async def test_a_wait_past_its_limit_is_a_timeout_and_the_engine_step_is_cancelled() -> None:
    engine = Engine()
    stream = EngineStream(engine.deltas())
    engine.release()
    await stream.next(HOUR)  # the timer is armed an hour away
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(stream.next(0.05))  # an earlier deadline arms it again
    await asyncio.wait({waiting}, timeout=10)
    assert waiting.done(), "the 50 ms limit did not end the wait"
    with pytest.raises(TimeoutError):
        waiting.result()
    assert loop.time() - started >= 0.04
    assert waiting.cancelling() == 0  # the cancel that ended it was taken back
    assert engine.cancelled


async def test_a_timer_that_fires_before_the_deadline_in_force_waits_for_it() -> None:
    engine = Engine()
    stream = EngineStream(engine.deltas())
    engine.release()
    await stream.next(0.05)  # the timer is set 50 ms from now
    waiting = asyncio.create_task(stream.next(HOUR))
    await asyncio.sleep(0.2)  # the timer has fired: the deadline in force is an hour away
    assert not waiting.done()
    engine.release("late")
    assert (await waiting).text == "late"
    await stream.close()


async def test_cut_short_ends_the_wait_at_once() -> None:
    engine = Engine()
    stream = EngineStream(engine.deltas())
    waiting = asyncio.create_task(stream.next(HOUR))
    await asyncio.sleep(0)
    stream.cut_short()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiting, 10)
    assert engine.cancelled  # the engine's step was cancelled, as a timeout cancels it
    await stream.close()


async def test_cut_short_with_no_wait_in_progress_changes_nothing() -> None:
    engine = Engine()
    stream = EngineStream(engine.deltas())
    stream.cut_short()
    engine.release("after")
    assert (await stream.next(HOUR)).text == "after"
    await stream.close()


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    engine = Engine()
    stream = EngineStream(engine.deltas())
    waiting = asyncio.create_task(stream.next(HOUR))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()
    await stream.close()


async def test_the_first_delta_asked_for_early_is_the_first_returned() -> None:
    engine = Engine()
    deltas = engine.deltas()
    pending = asyncio.ensure_future(anext(deltas))
    stream = EngineStream(deltas, pending=pending)
    engine.release("first")
    engine.release("second")
    assert (await stream.next(HOUR)).text == "first"
    assert (await stream.next(HOUR)).text == "second"
    await stream.close()
