"""The dashboard's figures per serving path, from stream records stored in the database."""

import json
import random
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from uuid import uuid4

import pytest

from assistant.benchmarking.stats import percentile
from assistant.models import StreamRecord
from assistant.services.beacons import Beacon
from assistant.services.dashboard import HISTOGRAM_EDGES_MS, traffic_snapshot

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BASE, CAND = "direct", "django"


def record(path: str = BASE, *, ago_s: float = 10.0, **fields: Any) -> StreamRecord:
    values: dict[str, Any] = {"engine": "scripted", "outcome": "ok", "tokens": 20, **fields}
    return StreamRecord(
        request_id=uuid4().hex,
        created_at=NOW - timedelta(seconds=ago_s),
        owner_key="session:test",
        path=path,
        **values,
    )


def reported(**client: Any) -> dict[str, Any]:
    """The fields a browser's beacon fills in."""
    return {"client_outcome": "ok", "client_reported_at": NOW, **client}


def store(*records: StreamRecord) -> None:
    StreamRecord.objects.bulk_create(records)


def snapshot(window_s: int = 300, **kwargs: Any) -> dict[str, Any]:
    """As the view sends it: through JSON."""
    result = traffic_snapshot(window_s=window_s, baseline=BASE, candidate=CAND, now=NOW, **kwargs)
    return json.loads(json.dumps(result))


def test_requests_errors_and_abandons_are_counted_per_path() -> None:
    outcomes = ["ok"] * 5 + ["client_abort"] * 3 + ["engine_error", "timeout"]
    store(*(record(BASE, outcome=outcome, ago_s=20) for outcome in outcomes))
    store(record(BASE, engine="llama", ago_s=1))
    store(*(record(CAND, engine="vllm", outcome=o) for o in ["ok", "ok", "ok", "server_error"]))
    store(*(record("other", outcome="engine_error") for _ in range(5)))
    store(record("api", engine="vllm"), record("api", engine="vllm", outcome="timeout"))

    paths = snapshot()["paths"]
    # The API's traffic is listed beside the two paths, under its own role; others are not.
    assert set(paths) == {BASE, CAND, "api"}
    assert (paths["api"]["role"], paths["api"]["requests"], paths["api"]["errors"]) == ("api", 2, 1)
    base, cand = paths[BASE], paths[CAND]
    assert (base["role"], base["engine"], cand["role"], cand["engine"]) == (
        "baseline",
        "llama",
        "candidate",
        "vllm",
    )
    assert (base["requests"], base["errors"], base["abandoned"]) == (11, 2, 3)
    assert (base["error_rate"], base["abandon_rate"]) == (0.1818, 0.2727)
    assert (cand["requests"], cand["errors"], cand["error_rate"], cand["abandoned"]) == (
        4,
        1,
        0.25,
        0,
    )
    assert snapshot()["ratio"]["error_rate_points"] == 6.82


def test_percentiles_interpolate_between_ranks() -> None:
    """Hand-computed: P95 of 10..50 ms lies 80 % of the way from 40 to 50."""
    store(*(record(BASE, server_ttft_ms=v) for v in (50, 10, 40, 20, 30)))
    store(*(record(CAND, server_ttft_ms=v * 10) for v in (10, 20, 30, 40, 50)))

    result = snapshot()
    server = result["paths"][BASE]["server_ttft_ms"]
    assert server == {"count": 5, "p50": 30.0, "p95": 48.0, "p99": 49.6}
    assert result["paths"][CAND]["server_ttft_ms"]["p95"] == 480.0
    assert result["ratio"]["server_p95"] == 10.0
    # Nobody's browser reported: no browser figures, no ratio of them.
    assert result["paths"][BASE]["client_ttft_ms"] == {
        "count": 0,
        "p50": None,
        "p95": None,
        "p99": None,
    }
    assert result["ratio"]["client_p95"] is None


def test_percentiles_are_the_benchmarks_over_the_stored_values() -> None:
    rng = random.Random(7)
    server = [round(rng.lognormvariate(5, 1), 3) for _ in range(300)]
    client = [round(v + rng.uniform(5, 80), 3) for v in server]
    store(
        *(
            record(BASE, server_ttft_ms=s, **reported(client_ttft_ms=c))
            for s, c in zip(server, client, strict=True)
        ),
        record(BASE, server_ttft_ms=None),  # no token came: not a TTFT
    )

    figures = snapshot()["paths"][BASE]
    for name, values in (("server_ttft_ms", server), ("client_ttft_ms", client)):
        assert figures[name]["count"] == 300
        for q in (50, 95, 99):
            assert figures[name][f"p{q}"] == round(percentile(values, q), 1)


def test_a_student_who_gave_up_counts_as_the_time_waited() -> None:
    """As in /metrics: the time waited stands for the TTFT that never came (or, without it, the
    time to the end), so the slowest requests are not dropped from the percentiles."""
    answered = reported(client_ttft_ms=300.0, client_waited_ms=5000.0)
    gave_up = reported(client_outcome="abandoned", client_waited_ms=2500.0)
    failed = reported(client_outcome="error", client_done_ms=800.0)
    store(
        record(CAND, server_ttft_ms=250.0, **answered),
        record(CAND, outcome="client_abort", **gave_up),
        record(CAND, outcome="engine_error", **failed),
        record(CAND, server_ttft_ms=100.0),  # the browser never reported
    )

    client = snapshot()["paths"][CAND]["client_ttft_ms"]
    # Sorted 300, 800, 2500: P99 is 98 % of the way from 800 to 2500.
    assert client == {"count": 3, "p50": 800.0, "p95": 2330.0, "p99": 2466.0}
    beacon = Beacon(
        request_id="x" * 8,
        outcome="abandoned",
        ttfb_ms=None,
        ttft_ms=None,
        done_ms=None,
        waited_ms=2500.0,
        itl_mean_ms=None,
        itl_max_ms=None,
        span_ms=None,
        tokens=None,
        burst_gaps=None,
    )
    assert beacon.client_ttft * 1000 == 2500.0


def test_window_includes_both_ends_and_nothing_outside() -> None:
    store(
        record(BASE, ago_s=300),
        record(BASE, ago_s=0),
        record(BASE, ago_s=300.001),
        record(BASE, ago_s=-1),  # a clock ahead of ours
        record(BASE, ago_s=3000),
    )

    assert snapshot(300)["paths"][BASE]["requests"] == 2
    assert snapshot(3600)["paths"][BASE]["requests"] == 4


def test_histogram_bins_start_at_their_lower_edge_and_the_last_takes_the_rest() -> None:
    edges = HISTOGRAM_EDGES_MS
    assert (edges[0], edges[1], edges[-1], len(edges) - 1) == (0.0, 10.0, 10000.0, 25)
    assert edges[9] == 100.0 and all(a < b for a, b in pairwise(edges))
    values = [0.0, 9.99, 10.0, 10.5, 99.9, 100.0, 9999.0, 10000.0, 50000.0]
    store(*(record(BASE, server_ttft_ms=v) for v in values))

    histogram = snapshot()["histogram"]
    assert histogram["edges_ms"] == list(edges)
    counts = histogram["counts"][BASE]["server"]
    assert len(counts) == len(edges) - 1 and sum(counts) == len(values)
    assert (counts[0], counts[1], counts[8], counts[9], counts[-1]) == (2, 2, 1, 1, 3)
    assert histogram["counts"][BASE]["client"] == [0] * (len(edges) - 1)
    assert histogram["counts"][CAND] == {"server": [0] * 25, "client": [0] * 25}


def test_slowest_are_ranked_by_browser_ttft_else_server_with_their_waterfalls() -> None:
    server_only = record(
        BASE,
        engine="llama",
        parse_ms=1.5,
        queue_ms=2.0,
        engine_ttft_ms=40.0,
        server_ttft_ms=900.0,
        e2e_ms=1500.25,
        buffered=None,
    )
    both = record(
        CAND,
        server_ttft_ms=100.0,
        buffered=True,
        **reported(client_ttfb_ms=80.0, client_ttft_ms=1200.0, client_done_ms=3000.0),
    )
    gave_up = record(
        BASE,
        outcome="client_abort",
        tokens=0,
        parse_ms=2.0,
        queue_ms=None,
        **reported(client_outcome="abandoned", client_ttfb_ms=90.0, client_waited_ms=5000.0),
    )
    fast = record(BASE, server_ttft_ms=50.0)
    no_ttft = record(BASE, outcome="engine_error", server_ttft_ms=None)
    old = record(BASE, server_ttft_ms=99999.0, ago_s=301)
    store(server_only, both, gave_up, fast, no_ttft, old)

    slowest = snapshot()["slowest"]
    assert [r["request_id"] for r in slowest] == [
        gave_up.request_id,
        both.request_id,
        server_only.request_id,
        fast.request_id,
    ]
    assert snapshot(slowest=2)["slowest"] == slowest[:2]
    first, second, third = slowest[:3]
    assert third == {
        "request_id": server_only.request_id,
        "at": server_only.created_at.isoformat(),
        "path": BASE,
        "engine": "llama",
        "outcome": "ok",
        "client_outcome": "",
        "tokens": 20,
        "buffered": None,
        "server": {
            "parsed": 1.5,
            "engine_submitted": 3.5,
            "engine_first_token": 43.5,
            "first_token_sent": 900.0,
            "finished": 1500.2,
        },
        "client": None,
    }
    assert (first["outcome"], first["client_outcome"], first["tokens"]) == (
        "client_abort",
        "abandoned",
        0,
    )
    assert first["server"] == {
        "parsed": 2.0,
        "engine_submitted": None,
        "engine_first_token": None,
        "first_token_sent": None,
        "finished": None,
    }
    assert first["client"] == {"ttfb": 90.0, "ttft": None, "done": None, "waited": 5000.0}
    assert (second["path"], second["buffered"]) == (CAND, True)
    assert second["client"] == {"ttfb": 80.0, "ttft": 1200.0, "done": 3000.0, "waited": None}


def test_buffered_counts_only_the_streams_that_could_be_judged() -> None:
    flags = [True, True, False, False, False, None, None, None, None]
    store(*(record(CAND, buffered=flag) for flag in flags))

    cand = snapshot()["paths"][CAND]
    assert (cand["buffered"], cand["buffered_checked"]) == (2, 5)


def test_an_empty_window_is_all_nulls_in_one_query(django_assert_num_queries) -> None:
    """One query for the three paths (the two compared, and the API's); nothing more without
    records."""
    store(record(BASE, server_ttft_ms=120.0, ago_s=400))
    with django_assert_num_queries(1):
        result = snapshot()

    for path, role in ((BASE, "baseline"), (CAND, "candidate"), ("api", "api")):
        figures = result["paths"][path]
        assert figures == {
            "role": role,
            "engine": None,
            "requests": 0,
            "errors": 0,
            "error_rate": None,
            "abandoned": 0,
            "abandon_rate": None,
            "buffered": 0,
            "buffered_checked": 0,
            "server_ttft_ms": {"count": 0, "p50": None, "p95": None, "p99": None},
            "client_ttft_ms": {"count": 0, "p50": None, "p95": None, "p99": None},
        }
    assert result["ratio"] == {"server_p95": None, "client_p95": None, "error_rate_points": None}
    assert result["slowest"] == []
    assert (result["servers"], result["servers_compared"]) == ({}, None)
    assert set(result) == {
        *("paths", "ratio", "histogram", "percentiles", "slowest", "servers", "servers_compared"),
    }
    assert result["percentiles"] == "exact"


def test_a_zero_baseline_p95_gives_no_ratio() -> None:
    store(record(BASE, server_ttft_ms=0.0), record(CAND, server_ttft_ms=30.0))

    assert snapshot()["ratio"]["server_p95"] is None


def test_a_busy_window_takes_four_queries(django_assert_num_queries) -> None:
    """The three paths' records; per path with records its latest engine; the slowest."""
    store(
        *(
            record(BASE, server_ttft_ms=float(i), **reported(client_ttft_ms=i + 9.0))
            for i in range(50)
        )
    )
    store(*(record(CAND, server_ttft_ms=float(i)) for i in range(50)))
    with django_assert_num_queries(4):
        result = snapshot(slowest=3)

    assert [r["client"]["ttft"] for r in result["slowest"]] == [58.0, 57.0, 56.0]


def test_baseline_and_candidate_must_differ() -> None:
    with pytest.raises(ValueError, match="different"):
        traffic_snapshot(window_s=300, baseline=BASE, candidate=BASE)


def test_each_server_is_counted_over_every_path_and_compared() -> None:
    """Records are counted per worker server (assistant/worker.py) as well as per path, on any
    path, "other" included; a record naming no server counts for its path only. uvicorn is
    compared with Daphne, P50 and P95 of the server's and the browser's TTFTs."""
    store(*(record(BASE, server="daphne", server_ttft_ms=float(ms)) for ms in (10, 20, 30, 40)))
    store(record("other", server="daphne", outcome="engine_error", server_ttft_ms=50.0))
    store(
        *(
            record(CAND, server="uvicorn", server_ttft_ms=float(ms), **reported(client_ttft_ms=ms))
            for ms in (5, 10, 15)
        )
    )
    store(record(BASE, server_ttft_ms=1000.0))  # named no server: runserver, a test client
    result = snapshot()

    assert result["paths"][BASE]["requests"] == 5
    daphne, uvicorn = result["servers"]["daphne"], result["servers"]["uvicorn"]
    assert set(result["servers"]) == {"daphne", "uvicorn"}
    assert (daphne["requests"], daphne["errors"], daphne["error_rate"]) == (5, 1, 0.2)
    assert daphne["server_ttft_ms"] == {"count": 5, "p50": 30.0, "p95": 48.0, "p99": 49.6}
    assert daphne["client_ttft_ms"]["count"] == 0
    assert (uvicorn["requests"], uvicorn["errors"]) == (3, 0)
    assert uvicorn["server_ttft_ms"]["p50"] == 10.0
    assert uvicorn["client_ttft_ms"] == {"count": 3, "p50": 10.0, "p95": 14.5, "p99": 14.9}
    assert result["servers_compared"] == {
        "baseline": "daphne",
        "candidate": "uvicorn",
        "server_p50": round(10.0 / 30.0, 3),
        "server_p95": round(14.5 / 48.0, 3),
        "client_p50": None,
        "client_p95": None,
    }


def test_one_server_alone_is_not_compared() -> None:
    store(*(record(BASE, server="uvicorn", server_ttft_ms=float(ms)) for ms in (10, 20)))
    result = snapshot()

    assert list(result["servers"]) == ["uvicorn"]
    assert result["servers_compared"] is None
