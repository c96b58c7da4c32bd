"""Ended answers observed together (``telemetry.stream_observe`` and ``ends_flush``): on an event
loop an answer's metrics and ``stream ended`` line wait for the batch's flush, each metric is
updated once per batch by its totals, each line keeps its own answer's end time, and nothing is
left behind by a loop that stopped before its flush. Real answers on the scripted engine, and
summaries made by the test where only the arithmetic is checked."""

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from assistant import metrics
from assistant.services import telemetry
from assistant.services.telemetry import AnswerSummary, Outcome, ends_flush, stream_observe
from assistant.services.timings import StreamTimings
from assistant.worker import server_name
from tests.assistant.services.answer_support import Harness, Live, question


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ended answers wait for an explicit ``ends_flush`` (the batch's timer an hour away), and
    none are waiting from earlier tests."""
    ends_flush()
    monkeypatch.setattr(telemetry, "ENDS_BATCH_S", 3600.0)
    yield
    ends_flush()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def figures(path: str, engine: str = "scripted") -> dict[str, float]:
    """The stream metrics an ended ``ok`` answer on ``path`` updates, as a scrape reads them."""
    server = server_name()
    return {
        "streams": sample(
            "ai_streams_total", path=path, engine=engine, outcome="ok", server=server
        ),
        "ttft": sample(
            "ai_ttft_seconds_count", path=path, engine=engine, source="server", server=server
        ),
        "gaps": sample("ai_inter_token_seconds_count", path=path, engine=engine, server=server),
        "gaps_sum": sample("ai_inter_token_seconds_sum", path=path, engine=engine, server=server),
        "tokens": sample("ai_tokens_total", path=path, engine=engine),
        "durations": sample(
            "ai_stream_duration_seconds_count",
            path=path,
            engine=engine,
            outcome="ok",
            server=server,
        ),
        "active": sample("ai_streams_active", path=path, engine=engine, server=server),
    }


def summary(
    path: str, *, tokens: int, gap_s: float = 0.01, engine: str = "scripted"
) -> AnswerSummary:
    """An ``ok`` answer of ``tokens`` tokens ``gap_s`` apart, as its end summarises it."""
    timings = StreamTimings(received=100.0, first_token_sent=100.05, finished=101.0)
    timings.tokens, timings.gaps = tokens, [gap_s] * (tokens - 1)
    return AnswerSummary(
        request_id=uuid.uuid4().hex,
        owner_key="session:test",
        classroom_id=None,
        serving_path=path,
        engine=engine,
        outcome=Outcome.OK,
        error_code="",
        conversation_id=uuid.uuid4(),
        message_id=uuid.uuid4(),
        timings=timings,
    )


def change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before[name], 6) for name in before}


@pytest.mark.django_db(transaction=True)
async def test_answers_that_ended_are_observed_at_the_flush_each_with_its_own_time(
    harness: Harness, held: None, streams_log: list[logging.LogRecord]
) -> None:
    before = figures("direct")
    began = time.time()
    ended: list[str] = []
    for tag in ("one", "two", "three"):
        answer = await harness.start(question(f"ends-{tag}", tokens=3))
        await harness.ended(harness.run(answer, Live()))
        ended.append(answer.request_id)
    # Ended, stored, and not yet counted or logged: they wait for the batch's flush.
    assert change(before, figures("direct"))["streams"] == 0
    assert not streams_log

    flushed_at = time.time()
    assert ends_flush() == 3
    moved = change(before, figures("direct"))
    assert {name: moved[name] for name in ("streams", "ttft", "durations", "active")} == {
        "streams": 3,
        "ttft": 3,
        "durations": 3,
        "active": 0,  # each answer's +1 at its start taken off at the flush
    }
    assert (moved["gaps"], moved["tokens"]) == (6, 9)
    assert [record.request_id for record in streams_log] == ended  # type: ignore[attr-defined]
    # Each line is timed when its answer ended, not when it was written.
    times = [record.created for record in streams_log]
    assert began <= times[0] <= times[1] <= times[2] < flushed_at
    assert ends_flush() == 0


def test_each_metric_is_updated_once_for_a_batch_by_its_totals(
    held: None, streams_log: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine of the test's own: no other test's figures move.
    path, engine = "django", "batched"
    server = server_name()
    streams = metrics.child(metrics.STREAMS, path, engine, "ok", server)
    incs: list[float] = []
    real = streams.inc

    def counted(amount: float = 1) -> None:
        incs.append(amount)
        real(amount)

    monkeypatch.setattr(streams, "inc", counted)
    before = figures(path, engine)

    async def answers_end() -> None:
        for tokens in (2, 4, 5):
            stream_observe(summary(path, tokens=tokens, gap_s=0.02, engine=engine))
        assert not streams_log and not incs  # waiting for the flush
        assert ends_flush() == 3

    asyncio.run(answers_end())
    assert incs == [3]
    moved = change(before, figures(path, engine))
    assert (moved["streams"], moved["ttft"], moved["durations"]) == (3, 3, 3)
    assert (moved["gaps"], moved["tokens"]) == (1 + 3 + 4, 2 + 4 + 5)
    assert moved["gaps_sum"] == pytest.approx(8 * 0.02)
    assert moved["active"] == -3  # these three were never counted as started
    assert len(streams_log) == 3


def test_the_batch_is_flushed_on_its_own_once_its_time_is_up(
    streams_log: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    ends_flush()
    monkeypatch.setattr(telemetry, "ENDS_BATCH_S", 0.05)
    ended = summary("direct", tokens=2)

    async def answer_ends() -> None:
        written = asyncio.Event()

        class Seen(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                written.set()  # on the loop: its timer writes the line

        logger, seen = logging.getLogger("assistant.streams"), Seen()
        logger.addHandler(seen)
        try:
            stream_observe(ended)
            assert not streams_log
            async with asyncio.timeout(10):
                await written.wait()
        finally:
            logger.removeHandler(seen)

    asyncio.run(answer_ends())
    assert [record.request_id for record in streams_log] == [ended.request_id]  # type: ignore[attr-defined]
    assert ends_flush() == 0


def test_without_an_event_loop_an_answer_is_observed_at_once(
    held: None, streams_log: list[logging.LogRecord]
) -> None:
    ended = summary("direct", tokens=2)
    stream_observe(ended)
    assert [record.request_id for record in streams_log] == [ended.request_id]  # type: ignore[attr-defined]
    assert ends_flush() == 0


def test_what_a_stopped_loop_left_is_observed_by_the_next_answer_elsewhere(
    held: None, streams_log: list[logging.LogRecord]
) -> None:
    first, second = summary("direct", tokens=2), summary("direct", tokens=3)

    async def ends(ended: AnswerSummary) -> None:
        stream_observe(ended)

    asyncio.run(ends(first))  # its loop closes with the flush still an hour away
    assert not streams_log
    asyncio.run(ends(second))
    assert [record.request_id for record in streams_log] == [first.request_id]  # type: ignore[attr-defined]
    assert ends_flush() == 1
    assert [record.request_id for record in streams_log] == [first.request_id, second.request_id]  # type: ignore[attr-defined]
