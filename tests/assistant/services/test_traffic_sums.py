"""The dashboard's long windows from minutes summed up (``services/traffic_sums.py``): the same
counts, histogram and slowest records as reading every record, percentiles within a fine bin, and
a minute summed up again when a record of it is stored or reported late."""

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from io import StringIO
from itertools import pairwise
from typing import Any
from uuid import uuid4

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from assistant.benchmarking.stats import percentile
from assistant.models import StreamRecord, TrafficSum
from assistant.services.beacons import Beacon, beacon_apply
from assistant.services.dashboard import histogram_counts, traffic_snapshot
from assistant.services.persistence import Rows, rows_write
from assistant.services.traffic_sums import KEEP_SUMS, SETTLE_S, minute_floor, sums_ahead
from assistant.services.ttft_bins import (
    HISTOGRAM_EDGES_MS,
    binned_percentiles,
    coarse_bin,
    fine_bin,
    fine_bounds,
)
from tests.support import row_of

BASE, CAND = "direct", "django"
DAY = 86400


def record(path: str, *, at: datetime, **fields: Any) -> StreamRecord:
    values: dict[str, Any] = {"engine": "scripted", "outcome": "ok", "tokens": 20, **fields}
    return StreamRecord(
        request_id=uuid4().hex, created_at=at, owner_key="session:test", path=path, **values
    )


def record_row(path: str, *, at: datetime, **fields: Any) -> dict[str, Any]:
    """``record`` as the group writer's row."""
    return row_of(record(path, at=at, **fields))


def summed_over(moment: datetime) -> bool:
    """Whether a stored sum covers ``moment``."""
    spans = TrafficSum.objects.values_list("start", "span_s")
    return any(start <= moment < start + timedelta(seconds=span_s) for start, span_s in spans)


def snapshot(window_s: int = DAY, *, now: datetime, **kwargs: Any) -> dict[str, Any]:
    result = traffic_snapshot(window_s=window_s, baseline=BASE, candidate=CAND, now=now, **kwargs)
    return json.loads(json.dumps(result))


def test_a_fine_bin_holds_its_values_and_lies_in_one_dashboard_bin() -> None:
    rng = random.Random(5)
    values = [rng.lognormvariate(4, 2) for _ in range(5000)] + [0.0, 9.99, 10.0, 13.3, 1e4, 1e7]
    values += list(HISTOGRAM_EDGES_MS)
    for value in values:
        index = fine_bin(value)
        low, high = fine_bounds(index)
        if value < 15 * 60 * 1000:
            assert low <= value * (1 + 1e-12) and value < high * (1 + 1e-12), (value, low, high)
        # The same dashboard bin as counting the value itself.
        expected = histogram_counts([value]).index(1)
        assert coarse_bin(index) == expected, value
    assert fine_bin(-3.0) == 0
    ordered = sorted(values)
    assert [fine_bin(v) for v in ordered] == sorted(fine_bin(v) for v in ordered)


def test_binned_percentiles_are_within_a_fine_bin_of_the_exact_ones() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(5, 1.2) for _ in range(20000)] + [
        rng.random() * 9 for _ in range(500)
    ]
    bins = Counter(map(fine_bin, values))
    qs = (1, 5, 50, 95, 99)
    for q, binned in zip(qs, binned_percentiles(bins, qs), strict=True):
        exact = percentile(values, q)
        assert binned is not None
        assert abs(binned - exact) <= max(0.1, exact * 0.02), (q, binned, exact)
    assert binned_percentiles(Counter(), [50]) == [None]


def _day_of_records(now: datetime, rng: random.Random) -> list[StreamRecord]:
    """About 3,000 records over the last day on the two paths, the API's and another, from
    both servers' workers and from one that names none; some reported by the browser, some
    failed or abandoned, some buffered."""
    records = []
    for _ in range(3000):
        at = now - timedelta(seconds=rng.uniform(0, DAY + 600))  # some before the window
        path = rng.choice([BASE, BASE, CAND, "api", "other"])
        outcome = rng.choice(["ok"] * 8 + ["client_abort", "engine_error"])
        fields: dict[str, Any] = {"outcome": outcome, "server_ttft_ms": rng.lognormvariate(5, 1)}
        if rng.random() < 0.7:
            fields |= {
                "client_outcome": "ok",
                "client_reported_at": at,
                "client_ttft_ms": fields["server_ttft_ms"] + rng.uniform(1, 40),
                "buffered": rng.random() < 0.1,
            }
        # The worker's server; "" as under runserver, which no server's figures count.
        fields["server"] = rng.choice(["daphne", "uvicorn", ""])
        records.append(record(path, at=at, **fields))
    return records


@pytest.mark.django_db
def test_a_days_window_from_minutes_is_the_window_read_record_by_record() -> None:
    """Counts, rates, histograms and the slowest records are the same as over every record;
    percentiles within a fine bin; the settled minutes are stored once, and a second snapshot
    reads them instead of their records."""
    now = timezone.now()
    rng = random.Random(11)
    StreamRecord.objects.bulk_create(_day_of_records(now, rng))
    start = now - timedelta(seconds=DAY)
    inside = list(StreamRecord.objects.filter(created_at__gte=start, created_at__lte=now))

    result = snapshot(now=now, slowest=10)

    assert result["percentiles"] == "binned"
    # Every minute from the window's first whole one to SETTLE_S ago, empty ones too: the whole
    # hours as hours (and their minutes, which they were added up from), the rest as minutes.
    spans = sorted(TrafficSum.objects.values_list("start", "span_s"))
    summed = len(spans)
    hours = [start for start, span_s in spans if span_s == 3600]
    minutes = {start for start, span_s in spans if span_s == 60}
    assert len(hours) >= 22
    for hour in hours:
        assert {hour + timedelta(minutes=i) for i in range(60)} <= minutes
    tiles = sorted(
        [(hour, 3600) for hour in hours]
        + [(m, 60) for m in minutes if minute_floor(m).replace(minute=0) not in hours]
    )
    assert all(a + timedelta(seconds=span_s) == b for (a, span_s), (b, _) in pairwise(tiles))
    assert tiles[0][0] == minute_floor(start) + timedelta(minutes=1)
    assert tiles[-1][0] + timedelta(seconds=tiles[-1][1]) == minute_floor(
        now - timedelta(seconds=SETTLE_S)
    )
    for path in (BASE, CAND, "api"):
        mine = [r for r in inside if r.path == path]
        figures = result["paths"][path]
        assert figures["requests"] == len(mine)
        assert figures["errors"] == sum(r.outcome == "engine_error" for r in mine)
        assert figures["abandoned"] == sum(r.outcome == "client_abort" for r in mine)
        assert figures["buffered"] == sum(bool(r.buffered) for r in mine)
        assert figures["buffered_checked"] == sum(r.buffered is not None for r in mine)
        server = sorted(r.server_ttft_ms for r in mine)
        client = sorted(r.client_ttft_ms for r in mine if r.client_reported_at is not None)
        for kind, values in (("server", server), ("client", client)):
            assert result["histogram"]["counts"][path][kind] == histogram_counts(values)
            summary = figures[f"{kind}_ttft_ms"]
            assert summary["count"] == len(values)
            for q in (50, 95, 99):
                exact = percentile(values, q)
                assert abs(summary[f"p{q}"] - exact) <= exact * 0.02 + 0.1, (path, kind, q)
    # Each server over every path, "other" included; the records naming none in neither.
    assert set(result["servers"]) == {"daphne", "uvicorn"}
    for name, figures in result["servers"].items():
        mine = [r for r in inside if r.server == name]
        assert figures["requests"] == len(mine)
        assert figures["errors"] == sum(r.outcome == "engine_error" for r in mine)
        server = sorted(r.server_ttft_ms for r in mine)
        client = sorted(r.client_ttft_ms for r in mine if r.client_reported_at is not None)
        for kind, values in (("server", server), ("client", client)):
            summary = figures[f"{kind}_ttft_ms"]
            assert summary["count"] == len(values)
            for q in (50, 95, 99):
                exact = percentile(values, q)
                assert abs(summary[f"p{q}"] - exact) <= exact * 0.02 + 0.1, (name, kind, q)
    compared = result["servers_compared"]
    assert (compared["baseline"], compared["candidate"]) == ("daphne", "uvicorn")
    servers = result["servers"]
    assert compared["client_p95"] == round(
        servers["uvicorn"]["client_ttft_ms"]["p95"] / servers["daphne"]["client_ttft_ms"]["p95"], 3
    )
    shown = [r for r in inside if r.path in (BASE, CAND, "api")]
    ttft = {
        r.request_id: r.client_ttft_ms if r.client_reported_at else r.server_ttft_ms for r in shown
    }
    slowest = sorted(ttft, key=lambda rid: ttft[rid], reverse=True)[:10]
    assert [r["request_id"] for r in result["slowest"]] == slowest

    again = snapshot(now=now, slowest=10)
    assert again == result
    assert TrafficSum.objects.count() == summed


@pytest.mark.django_db
def test_a_short_window_stays_exact() -> None:
    now = timezone.now()
    StreamRecord.objects.bulk_create(
        [record(BASE, at=now - timedelta(seconds=200), server_ttft_ms=ms) for ms in (10.0, 50.0)]
    )
    result = snapshot(300, now=now)
    assert result["percentiles"] == "exact"
    assert result["paths"][BASE]["server_ttft_ms"]["p50"] == 30.0
    assert not TrafficSum.objects.exists()


@pytest.mark.django_db
def test_the_window_edges_are_read_record_by_record() -> None:
    """The part of a minute at the window's start counts only from the start; the minutes not
    yet settled (the last SETTLE_S) are read as they are."""
    now = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
    start = now - timedelta(hours=1)
    StreamRecord.objects.bulk_create(
        [
            record(BASE, at=start - timedelta(seconds=10), server_ttft_ms=1.0),  # outside
            record(BASE, at=start + timedelta(seconds=10), server_ttft_ms=2.0),
            record(BASE, at=start + timedelta(seconds=50), server_ttft_ms=3.0),  # next minute
            record(BASE, at=now - timedelta(minutes=30), server_ttft_ms=4.0),
            record(BASE, at=now, server_ttft_ms=5.0),
            record(BASE, at=now + timedelta(seconds=1), server_ttft_ms=6.0),  # outside
        ]
    )
    figures = snapshot(3600, now=now)["paths"][BASE]
    assert figures["requests"] == 4
    assert figures["server_ttft_ms"]["p50"] == pytest.approx(3.5, abs=0.15)
    assert TrafficSum.objects.filter(
        start=minute_floor(now - timedelta(minutes=30)), span_s=60
    ).exists()


@pytest.mark.django_db(transaction=True)
def test_a_late_beacon_and_a_late_record_are_counted_again() -> None:
    """A minute summed up already is summed up again once a record of it is reported by its
    browser, or stored, after it settled."""
    now = timezone.now()
    an_hour_ago = now - timedelta(hours=1)
    early = record(BASE, at=an_hour_ago, server_ttft_ms=40.0, message_id=uuid4())
    StreamRecord.objects.bulk_create([early])
    first = snapshot(now=now)["paths"][BASE]
    assert (first["requests"], first["client_ttft_ms"]["count"]) == (1, 0)
    assert summed_over(an_hour_ago)

    beacon = Beacon(
        request_id=early.request_id, outcome="ok", ttfb_ms=50.0, ttft_ms=60.0, done_ms=900.0,
        waited_ms=None, itl_mean_ms=None, itl_max_ms=None, span_ms=None, tokens=None,
        burst_gaps=None,
    )  # fmt: skip
    beacon_apply(owner_key="session:test", beacon=beacon)
    assert not summed_over(an_hour_ago)
    second = snapshot(now=now)["paths"][BASE]
    assert second["client_ttft_ms"]["count"] == 1
    assert second["client_ttft_ms"]["p50"] == pytest.approx(60.0, rel=0.02)

    # A stream that began an hour ago and is stored only now (a long one).
    rows_write([Rows(records=[record_row(BASE, at=an_hour_ago, server_ttft_ms=90.0)])])
    third = snapshot(now=now)["paths"][BASE]
    assert third["requests"] == 2
    assert third["server_ttft_ms"]["count"] == 2


@pytest.mark.django_db
def test_only_a_record_stored_late_touches_the_summed_minutes() -> None:
    """An answer stored as it ends costs no query on the summed minutes; one stored after its
    minute settled costs one."""
    connection = connections["default"]
    with CaptureQueriesContext(connection) as in_time:
        rows_write([Rows(records=[record_row(BASE, at=timezone.now(), server_ttft_ms=5.0)])])
    an_hour_ago = timezone.now() - timedelta(hours=1)
    with CaptureQueriesContext(connection) as late:
        rows_write([Rows(records=[record_row(BASE, at=an_hour_ago, server_ttft_ms=5.0)])])
    touching = [q["sql"] for q in late.captured_queries if "trafficsum" in q["sql"].lower()]
    assert len(touching) == 1 and touching[0].upper().startswith("DELETE")
    assert not [q for q in in_time.captured_queries if "trafficsum" in q["sql"].lower()]


@pytest.mark.django_db
def test_summed_ahead_a_dashboard_sums_nothing_and_old_sums_go() -> None:
    """After ``manage.py traffic_sum`` (``sums_ahead``) a day's window finds every span it
    needs; sums older than two days are deleted."""
    now = timezone.now()
    StreamRecord.objects.bulk_create(_day_of_records(now, random.Random(3))[:500])
    TrafficSum.objects.create(start=minute_floor(now - timedelta(days=3)), span_s=60, paths={})

    spans = sums_ahead(now=now)

    assert spans >= 24 and not TrafficSum.objects.filter(start__lt=now - KEEP_SUMS).exists()
    with CaptureQueriesContext(connections["default"]) as queries:
        snapshot(now=now)
    assert not [q for q in queries.captured_queries if "INSERT" in q["sql"].upper()]
    out = StringIO()
    call_command("traffic_sum", stdout=out)
    assert "the last day is summed up in" in out.getvalue()
