"""Traffic on the two serving paths for the staff dashboard, over one window of stream records.

Synchronous (ORM). The view calls it about once a second with windows of up to a day (100k
records), so it never loads model instances: per path, one query reads only the columns it needs
over the (path, created_at) index and one reads the path's latest engine; one more reads the
slowest records' stage times. Percentiles (numpy's default method, as the benchmarks report them)
and histogram counts are computed in Python from the values sorted once. Every time is in
milliseconds, rounded to 0.1 ms; a figure without data is None (null in JSON), never 0.
"""

import heapq
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.utils import timezone

from assistant import errors
from assistant.benchmarking.stats import percentile
from assistant.errors import Rejected
from assistant.models import StreamRecord
from assistant.services.beacons import client_ttft_ms
from assistant.services.serving_state import API_PATH
from assistant.services.telemetry import SERVER_FAULTS

#: The windows the dashboard offers, in seconds.
WINDOWS: dict[str, int] = {"5m": 300, "1h": 3600, "24h": 86400}
#: TTFT histogram bin edges (ms): [0, 10), then 8 bins per decade up to 10 s, each edge about
#: 33 % above the last. Values at or above the last edge are counted in the last bin.
HISTOGRAM_EDGES_MS: tuple[float, ...] = (0.0, *(round(10 * 10 ** (i / 8), 1) for i in range(25)))
PERCENTILES = (50, 95, 99)
#: Annotates a record with whether the browser reported its timings.
REPORTED = ExpressionWrapper(Q(client_reported_at__isnull=False), output_field=BooleanField())
#: What the figures of a path need from each record in the window.
_WINDOW_FIELDS = (
    "pk", "outcome", "buffered", "server_ttft_ms",
    "client_ttft_ms", "client_waited_ms", "client_done_ms", "reported",
)  # fmt: skip
#: What the slowest records show: where they ran, how they ended, their stage times.
_SLOWEST_FIELDS = (
    "pk", "request_id", "created_at", "path", "engine", "outcome", "client_outcome", "tokens",
    "buffered", "parse_ms", "queue_ms", "engine_ttft_ms", "server_ttft_ms", "e2e_ms",
    "client_ttfb_ms", "client_ttft_ms", "client_done_ms", "client_waited_ms", "client_reported_at",
)  # fmt: skip


@dataclass(slots=True)
class PathWindow:
    """What one path's (or one class's) records in the window add up to, before rounding."""

    requests: int = 0
    errors: int = 0
    abandoned: int = 0
    buffered: int = 0
    buffered_checked: int = 0
    server_ttft_ms: list[float] = field(default_factory=list)
    client_ttft_ms: list[float] = field(default_factory=list)
    #: (TTFT, pk) of each record with one: the browser's where it reported, else the server's.
    ranked: list[tuple[float, int]] = field(default_factory=list)

    def add(
        self, *, pk: int, outcome: str, buffered: bool | None, server: float | None,
        client: float | None,
    ) -> None:  # fmt: skip
        """Count one record: its outcome, whether it was buffered, its server TTFT and its
        browser TTFT (None: the browser did not report)."""
        self.requests += 1
        self.errors += outcome in SERVER_FAULTS
        self.abandoned += outcome == StreamRecord.Outcome.CLIENT_ABORT
        if buffered is not None:
            self.buffered_checked += 1
            self.buffered += buffered
        if server is not None:
            self.server_ttft_ms.append(server)
        if client is not None:
            self.client_ttft_ms.append(client)
            self.ranked.append((client, pk))
        elif server is not None:
            self.ranked.append((server, pk))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _rate(count: int, total: int) -> float | None:
    return round(count / total, 4) if total else None


def _ratio(candidate: float | None, baseline: float | None) -> float | None:
    return round(candidate / baseline, 3) if candidate is not None and baseline else None


def window_chosen(value: str | None, default: str) -> str:
    """One of ``WINDOWS`` from a request's ``window`` parameter (``default`` when absent);
    ``Rejected`` (400 ``window_invalid``) for anything else."""
    window = default if value is None else value
    if window not in WINDOWS:
        raise Rejected(errors.WINDOW_INVALID)
    return window


def _in_window(*, path: str, start: datetime, end: datetime) -> QuerySet[StreamRecord]:
    return StreamRecord.objects.filter(path=path, created_at__gte=start, created_at__lte=end)


def path_window_read(*, path: str, start: datetime, end: datetime) -> PathWindow:
    """Synchronous (ORM), one query: the records on ``path`` created in [start, end]."""
    rows = (
        _in_window(path=path, start=start, end=end)
        .order_by()
        .annotate(reported=REPORTED)
        .values_list(*_WINDOW_FIELDS)
    )
    window = PathWindow()
    for pk, outcome, buffered, server, ttft, waited, done, was_reported in rows:
        client = (
            client_ttft_ms(ttft_ms=ttft, waited_ms=waited, done_ms=done) if was_reported else None
        )
        window.add(
            pk=pk,
            outcome=outcome,
            buffered=buffered,
            server=server,
            client=client,
        )
    return window


def ttft_summary(ordered: Sequence[float]) -> dict[str, Any]:
    """Count and percentiles of sorted values (ms); the percentiles are None without values."""
    summary: dict[str, Any] = {"count": len(ordered)}
    for q in PERCENTILES:
        summary[f"p{q}"] = _ms(percentile(ordered, q)) if ordered else None
    return summary


def histogram_counts(ordered: Sequence[float]) -> list[int]:
    """How many of the sorted values fall in each [edge, next edge) bin of HISTOGRAM_EDGES_MS;
    below 0 counts in the first bin, at or above the last edge in the last one."""
    cuts = [bisect_left(ordered, edge) for edge in HISTOGRAM_EDGES_MS[1:-1]]
    bounds = [0, *cuts, len(ordered)]
    return [high - low for low, high in pairwise(bounds)]


def _path_figures(window: PathWindow, *, role: str, engine: str | None) -> dict[str, Any]:
    return {
        "role": role,
        "engine": engine,
        "requests": window.requests,
        "errors": window.errors,
        "error_rate": _rate(window.errors, window.requests),
        "abandoned": window.abandoned,
        "abandon_rate": _rate(window.abandoned, window.requests),
        "buffered": window.buffered,
        "buffered_checked": window.buffered_checked,
        "server_ttft_ms": ttft_summary(window.server_ttft_ms),
        "client_ttft_ms": ttft_summary(window.client_ttft_ms),
    }


def _cumulative(*parts: float | None) -> float | None:
    """The time at the end of consecutive stages; None when one of them is unknown."""
    return None if None in parts else round(sum(p for p in parts if p is not None), 1)


def slowest_records(ranked: list[tuple[float, int]], *, limit: int) -> list[dict[str, Any]]:
    """Synchronous (ORM), one query: the ``limit`` records with the largest TTFT, slowest first,
    with their stage times as a waterfall (ms since the request arrived, or since fetch was
    called for the browser's)."""
    top = heapq.nlargest(limit, ranked)
    if not top:
        return []
    rows = StreamRecord.objects.filter(pk__in=[pk for _, pk in top]).values(*_SLOWEST_FIELDS)
    by_pk = {row["pk"]: row for row in rows}
    result = []
    for _, pk in top:
        row = by_pk.get(pk)
        if row is None:  # deleted in between
            continue
        submitted = _cumulative(row["parse_ms"], row["queue_ms"])
        result.append(
            {
                "request_id": row["request_id"],
                "at": row["created_at"].isoformat(),
                "path": row["path"],
                "engine": row["engine"],
                "outcome": row["outcome"],
                "client_outcome": row["client_outcome"],
                "tokens": row["tokens"],
                "buffered": row["buffered"],
                "server": {
                    "parsed": _ms(row["parse_ms"]),
                    "engine_submitted": submitted,
                    "engine_first_token": _cumulative(submitted, row["engine_ttft_ms"]),
                    "first_token_sent": _ms(row["server_ttft_ms"]),
                    "finished": _ms(row["e2e_ms"]),
                },
                "client": None
                if row["client_reported_at"] is None
                else {
                    "ttfb": _ms(row["client_ttfb_ms"]),
                    "ttft": _ms(row["client_ttft_ms"]),
                    "done": _ms(row["client_done_ms"]),
                    "waited": _ms(row["client_waited_ms"]),
                },
            }
        )
    return result


def traffic_snapshot(
    *,
    window_s: int,
    baseline: str,
    candidate: str,
    now: datetime | None = None,
    slowest: int = 10,
) -> dict[str, Any]:
    """Synchronous (ORM): the baseline and candidate paths over the records created in
    [now - window_s, now], as JSON-ready values.

    Returns ``paths`` (per path: role, latest engine, requests, errors and abandons with their
    rates, buffered streams, server and browser TTFT percentiles), ``ratio`` (candidate over
    baseline P95s, and the error-rate difference in points; the ``api`` path is listed too, not
    compared), ``histogram`` (TTFT counts per bin
    of ``edges_ms``) and ``slowest`` (the slowest records on either path, with their
    waterfalls). At most seven queries; three when the window is empty.
    """
    if baseline == candidate:
        raise ValueError("baseline and candidate must be different paths")
    end = now or timezone.now()
    start = end - timedelta(seconds=window_s)
    paths: dict[str, Any] = {}
    counts: dict[str, dict[str, list[int]]] = {}
    ranked: list[tuple[float, int]] = []
    # The API's traffic (services/api_answer.py) is shown beside the two paths it is split
    # between, labelled as its own.
    for role, path in (("baseline", baseline), ("candidate", candidate), ("api", API_PATH)):
        window = path_window_read(path=path, start=start, end=end)
        window.server_ttft_ms.sort()
        window.client_ttft_ms.sort()
        engine = None
        if window.requests:
            latest = _in_window(path=path, start=start, end=end).order_by("-created_at", "-pk")
            engine = latest.values_list("engine", flat=True).first()
        paths[path] = _path_figures(window, role=role, engine=engine)
        counts[path] = {
            "server": histogram_counts(window.server_ttft_ms),
            "client": histogram_counts(window.client_ttft_ms),
        }
        ranked += window.ranked
    base, cand = paths[baseline], paths[candidate]
    points = None
    if base["error_rate"] is not None and cand["error_rate"] is not None:
        points = round((cand["error_rate"] - base["error_rate"]) * 100, 2)
    return {
        "paths": paths,
        "ratio": {
            "server_p95": _ratio(cand["server_ttft_ms"]["p95"], base["server_ttft_ms"]["p95"]),
            "client_p95": _ratio(cand["client_ttft_ms"]["p95"], base["client_ttft_ms"]["p95"]),
            "error_rate_points": points,
        },
        "histogram": {"edges_ms": list(HISTOGRAM_EDGES_MS), "counts": counts},
        "slowest": slowest_records(ranked, limit=slowest),
    }
