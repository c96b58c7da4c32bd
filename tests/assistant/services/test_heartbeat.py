"""The pings beside an answer's live listener (``frames.Heartbeat``): a ping for each silent
``interval``, none once stopped, and no task for a stream that is never silent that long."""

import asyncio

from assistant.services.frames import PING, Heartbeat


async def test_a_stream_never_silent_that_long_makes_no_task_and_sends_nothing() -> None:
    sent: list[bytes] = []

    async def send(frame: bytes) -> None:
        sent.append(frame)

    before = asyncio.all_tasks()
    heartbeat = Heartbeat(send, interval=60.0)
    heartbeat.start()
    for _ in range(3):
        await asyncio.sleep(0)
        heartbeat.beat()
    assert asyncio.all_tasks() == before
    heartbeat.stop()
    await asyncio.sleep(0)
    assert sent == []
    assert asyncio.all_tasks() == before


async def test_a_silent_stream_is_pinged_each_interval_until_stopped() -> None:
    sent: list[bytes] = []
    pinged = asyncio.Event()

    async def send(frame: bytes) -> None:
        sent.append(frame)
        if len(sent) == 3:
            pinged.set()

    heartbeat = Heartbeat(send, interval=0.02)
    heartbeat.start()
    await asyncio.wait_for(pinged.wait(), timeout=10)  # a sanity bound, not a timing
    heartbeat.stop()
    count = len(sent)
    await asyncio.sleep(0.1)
    assert sent == [PING] * count
    assert count >= 3


async def test_a_ping_being_sent_is_cancelled_by_stop() -> None:
    started, sending = asyncio.Event(), asyncio.Event()
    cancelled: list[bool] = []

    async def send(frame: bytes) -> None:
        started.set()
        try:
            await sending.wait()  # a client that does not take the ping
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    heartbeat = Heartbeat(send, interval=0.01)
    heartbeat.start()
    await asyncio.wait_for(started.wait(), timeout=10)
    heartbeat.stop()
    for _ in range(3):
        await asyncio.sleep(0)
    assert cancelled == [True]
