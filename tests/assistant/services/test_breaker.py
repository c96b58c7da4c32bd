"""The circuit breaker on stored stream records: when it trips, when it must not, how it heals."""

from datetime import datetime, timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from assistant.models import BreakerEvent, ServingState, StreamRecord
from assistant.services.breaker import breaker_evaluate
from assistant.services.serving import split_change, split_load

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("breaker_settings"),
]

BREAKER = {
    "WINDOW_S": 300.0,
    "MIN_SAMPLES": 50,
    "P95_RATIO": 1.2,
    "ERROR_MARGIN": 0.05,
    "COOLDOWN_S": 60.0,
    "HALF_OPEN_PERCENT": 5.0,
    "HALF_OPEN_SAMPLES": 20,
    "EVALUATE_S": 2.0,
}


@pytest.fixture
def breaker_settings() -> None:
    with override_settings(CHATSITE_BREAKER=BREAKER):
        split_change(percent=20, mode="auto", actor="teacher")
        BreakerEvent.objects.all().delete()
        yield


_serial = iter(range(10**9))


def records(path: str, n: int, *, ttft: float, at: datetime, errors: int = 0) -> None:
    StreamRecord.objects.bulk_create(
        StreamRecord(
            request_id=f"r{next(_serial):012d}",
            created_at=at - timedelta(milliseconds=i),
            owner_key="session:x",
            path=path,
            engine="scripted",
            outcome="engine_error" if i < errors else "ok",
            server_ttft_ms=ttft + i % 7,
        )
        for i in range(n)
    )


def evaluate(at: datetime) -> BreakerEvent | None:
    return breaker_evaluate(now=at)


def test_a_slow_candidate_trips_the_breaker_with_the_figures() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 55, ttft=150, at=now)
    event = evaluate(now)
    assert event is not None and event.kind == "tripped"
    assert event.figures["candidate"]["p95_ms"] > 1.2 * event.figures["baseline"]["p95_ms"]
    assert event.figures["candidate"]["samples"] == 55
    assert "django P95 server TTFT" in event.message
    split = split_load()
    assert split.breaker == "open" and split.effective_percent == 0


def test_a_candidate_within_the_ratio_does_not_trip() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 60, ttft=115, at=now)
    assert evaluate(now) is None
    assert split_load().breaker == "closed"


def test_below_the_minimum_sample_count_nothing_trips() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 49, ttft=900, at=now, errors=49)
    assert evaluate(now) is None
    assert split_load().breaker == "closed"
    records("django", 1, ttft=900, at=now)
    assert evaluate(now + timedelta(seconds=5)).kind == "tripped"


def test_records_outside_the_window_do_not_count() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 60, ttft=900, at=now - timedelta(seconds=301))
    assert evaluate(now) is None


def test_more_errors_than_the_margin_trip_it() -> None:
    now = timezone.now()
    records("direct", 100, ttft=100, at=now, errors=1)
    records("django", 100, ttft=100, at=now, errors=7)  # 7% > 1% + 5 points
    event = evaluate(now)
    assert event is not None and "failed 7.0%" in event.message


def test_an_error_rate_within_the_margin_does_not_trip() -> None:
    now = timezone.now()
    records("direct", 100, ttft=100, at=now, errors=1)
    records("django", 100, ttft=100, at=now, errors=5)
    assert evaluate(now) is None


def test_after_the_cool_down_half_open_then_closed_when_healthy() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 60, ttft=300, at=now)
    assert evaluate(now).kind == "tripped"
    assert evaluate(now + timedelta(seconds=30)) is None  # still cooling down
    half = evaluate(now + timedelta(seconds=61))
    assert half is not None and half.kind == "half_open"
    split = split_load()
    assert split.breaker == "half_open" and split.effective_percent == 5
    # The slow streams from before the trip no longer count; fresh healthy ones close it.
    later = now + timedelta(seconds=70)
    records("django", 19, ttft=100, at=later)
    assert evaluate(later) is None  # fewer than HALF_OPEN_SAMPLES
    records("django", 1, ttft=100, at=later)
    closed = evaluate(later + timedelta(seconds=3))
    assert closed is not None and closed.kind == "closed"
    assert split_load().effective_percent == 20


def test_half_open_reopens_when_still_slow() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 60, ttft=300, at=now)
    evaluate(now)
    evaluate(now + timedelta(seconds=61))
    later = now + timedelta(seconds=70)
    records("django", 20, ttft=300, at=later)
    event = evaluate(later)
    assert event is not None and event.kind == "reopened"
    assert split_load().breaker == "open"


def test_a_forced_mode_is_left_alone() -> None:
    split_change(percent=None, mode="force_candidate", actor="teacher")
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    records("django", 60, ttft=900, at=now)
    assert evaluate(now) is None
    assert split_load().route("any-session") == "django"


def test_only_one_evaluation_per_interval_whoever_asks() -> None:
    now = timezone.now()
    records("direct", 60, ttft=100, at=now)
    assert evaluate(now) is None
    records("django", 60, ttft=900, at=now)
    # Another process evaluating a moment later does nothing; after the interval it trips.
    assert evaluate(now + timedelta(milliseconds=500)) is None
    assert ServingState.objects.get(pk=1).breaker == "closed"
    assert evaluate(now + timedelta(seconds=2)).kind == "tripped"
