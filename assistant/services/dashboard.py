"""Traffic on the two serving paths for the staff dashboard, over one window of stream records,
and on the two HTTP servers the workers may run under (``assistant/worker.py``).

Synchronous (ORM). The view calls it about once a second with windows of up to a day (a
million records at a school's scale), so it never loads model instances. A window of up to
five minutes is read record by record (only the columns it needs, over the created_at index)
and its percentiles (numpy's default method, as the benchmarks report them) are exact.
A longer one adds up the minutes summed up already (``services/traffic_sums.py``: 1,440 rows
for a day) and reads only the rest record by record; its percentiles come from fine bins
(within 1.8 %, or 0.05 ms below 10 ms), as ``percentiles: "binned"`` says. Then, per path, one
query reads its latest engine, and one more reads the slowest records' stage times. Every time
is in milliseconds, rounded to 0.1 ms; a figure without data is None (null in JSON), never 0.
"""

import heapq
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from assistant import errors
from assistant.benchmarking.stats import percentile
from assistant.errors import Rejected
from assistant.models import StreamRecord
from assistant.services.serving_state import API_PATH
from assistant.services.traffic_sums import (
    SERVER_GROUP,
    SETTLE_S,
    PathWindow,
    minute_ceil,
    minute_floor,
    records_in,
    records_read,
    spans_read,
)
from assistant.services.ttft_bins import (
    HISTOGRAM_EDGES_MS,
    binned_histogram,
    binned_percentiles,
    fine_bin,
)
from assistant.worker import SERVERS

#: The windows the dashboard offers, in seconds.
WINDOWS: dict[str, int] = {"5m": 300, "1h": 3600, "24h": 86400}
#: Windows up to this long (s) are read record by record, their percentiles exact; longer ones
#: from the minutes summed up (``services/traffic_sums.py``), with the unsettled rest and
#: the part of a minute at the start read record by record.
EXACT_UP_TO_S = 300
PERCENTILES = (50, 95, 99)
#: What the slowest records show: where they ran, how they ended, their stage times.
_SLOWEST_FIELDS = (
    "pk", "request_id", "created_at", "path", "engine", "outcome", "client_outcome", "tokens",
    "buffered", "parse_ms", "queue_ms", "engine_ttft_ms", "server_ttft_ms", "e2e_ms",
    "client_ttfb_ms", "client_ttft_ms", "client_done_ms", "client_waited_ms", "client_reported_at",
)  # fmt: skip


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


def windows_read(*, paths: Sequence[str], start: datetime, end: datetime) -> dict[str, PathWindow]:
    """Synchronous (ORM): what the records created in [start, end] add up to, for each of
    ``paths`` and, under ``traffic_sums.server_group(name)``, for each server named by any
    record. Record by record in one query for a window of up to ``EXACT_UP_TO_S``; else the
    whole minutes settled by ``end`` (``SETTLE_S`` before it) from their sums, and the rest
    record by record: two queries, and two more per hour of minutes not summed up yet."""
    windows = {path: PathWindow() for path in paths}
    first = minute_ceil(start)
    settled = minute_floor(end - timedelta(seconds=SETTLE_S))
    if (end - start).total_seconds() <= EXACT_UP_TO_S or settled <= first:
        records_read(records_in(Q(created_at__gte=start, created_at__lte=end)), windows)
        return windows
    for summed in spans_read(first, settled):
        for group, part in summed.items():
            if group.startswith(SERVER_GROUP):
                windows.setdefault(group, PathWindow()).merge(part)
            elif (window := windows.get(group)) is not None:
                window.merge(part)
    edges = Q(created_at__gte=start, created_at__lt=first) | Q(
        created_at__gte=settled, created_at__lte=end
    )
    records_read(records_in(edges), windows)
    return windows


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


def _binned_summary(bins: Counter[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {"count": sum(bins.values())}
    for q, value in zip(PERCENTILES, binned_percentiles(bins, PERCENTILES), strict=True):
        summary[f"p{q}"] = _ms(value)
    return summary


def ttft_figures(values: list[float], bins: Counter[int]) -> tuple[dict[str, Any], list[int]]:
    """Summary and histogram counts of TTFTs: exact from ``values`` alone, else with them
    added to the fine ``bins`` of the minutes summed up (``traffic_sums.binned_*``)."""
    if not bins:
        values.sort()
        return ttft_summary(values), histogram_counts(values)
    bins = bins + Counter(map(fine_bin, values))
    return _binned_summary(bins), binned_histogram(bins)


def ttft_summary_of(values: list[float], bins: Counter[int]) -> dict[str, Any]:
    """``ttft_figures``' summary alone, without the histogram."""
    if not bins:
        values.sort()
        return ttft_summary(values)
    return _binned_summary(bins + Counter(map(fine_bin, values)))


def _server_figures(
    window: PathWindow, *, server: dict[str, Any] | None = None,
    client: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Requests, errors and TTFT summaries of a window (those given, else computed)."""
    if server is None:
        server = ttft_summary_of(window.server_ttft_ms, window.server_bins)
    if client is None:
        client = ttft_summary_of(window.client_ttft_ms, window.client_bins)
    return {
        "requests": window.requests,
        "errors": window.errors,
        "error_rate": _rate(window.errors, window.requests),
        "server_ttft_ms": server,
        "client_ttft_ms": client,
    }


def _path_figures(
    window: PathWindow, *, role: str, engine: str | None, server: dict[str, Any],
    client: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    return {
        "role": role,
        "engine": engine,
        **_server_figures(window, server=server, client=client),
        "abandoned": window.abandoned,
        "abandon_rate": _rate(window.abandoned, window.requests),
        "buffered": window.buffered,
        "buffered_checked": window.buffered_checked,
    }


def servers_compared(servers: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The second of ``worker.SERVERS`` (uvicorn) against the first (Daphne): its TTFT
    percentiles over theirs, below 1 where it is faster; None unless both served records."""
    baseline, candidate = SERVERS
    if baseline not in servers or candidate not in servers:
        return None
    base, cand = servers[baseline], servers[candidate]
    compared: dict[str, Any] = {"baseline": baseline, "candidate": candidate}
    for side in ("server", "client"):
        for q in (50, 95):
            key = f"p{q}"
            compared[f"{side}_{key}"] = _ratio(
                cand[f"{side}_ttft_ms"][key], base[f"{side}_ttft_ms"][key]
            )
    return compared


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
    compared), ``histogram`` (TTFT counts per bin of ``edges_ms``), ``percentiles`` ("exact",
    or "binned" when minutes summed up were added), ``slowest`` (the slowest records on either
    path, with their waterfalls), ``servers`` (per HTTP server named by the records, on any
    path: requests, errors, server and browser TTFT percentiles) and ``servers_compared``
    (uvicorn over Daphne, from ``servers_compared``). A window of up to ``EXACT_UP_TO_S``: at
    most five queries, one when it is empty; a longer one: one more (its minutes), and two per
    hour of minutes summed up on the way.
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
    roles = {baseline: "baseline", candidate: "candidate", API_PATH: "api"}
    windows = windows_read(paths=list(roles), start=start, end=end)
    binned = False
    for path, role in roles.items():
        window = windows[path]
        engine = None
        if window.requests:
            latest = _in_window(path=path, start=start, end=end).order_by("-created_at", "-pk")
            engine = latest.values_list("engine", flat=True).first()
        server, server_counts = ttft_figures(window.server_ttft_ms, window.server_bins)
        client, client_counts = ttft_figures(window.client_ttft_ms, window.client_bins)
        binned |= bool(window.server_bins or window.client_bins)
        paths[path] = _path_figures(window, role=role, engine=engine, server=server, client=client)
        counts[path] = {"server": server_counts, "client": client_counts}
        ranked += window.ranked
    servers = {
        group.removeprefix(SERVER_GROUP): _server_figures(window)
        for group, window in sorted(windows.items())
        if group.startswith(SERVER_GROUP)
    }
    binned |= any(w.server_bins or w.client_bins for w in windows.values())
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
        "servers": servers,
        "servers_compared": servers_compared(servers),
        "histogram": {"edges_ms": list(HISTOGRAM_EDGES_MS), "counts": counts},
        "percentiles": "binned" if binned else "exact",
        "slowest": slowest_records(ranked, limit=slowest),
    }
