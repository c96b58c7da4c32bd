"""Stream records summed up a minute and an hour at a time, so that a day's dashboard reads a
few dozen rows instead of a million.

A ``TrafficSum`` holds, for each path with records created in its span, and for each worker
server under ``server_group(name)`` (``assistant/worker.py``; a record counts in both): the
counts the dashboard shows (requests, errors, abandons, buffered), the server's and the
browser's TTFTs as counts in fine bins, and the span's 10 slowest records (TTFT, pk). A minute
is summed up from its records once it has settled (``SETTLE_S`` after its end, when its streams
have ended and their beacons have come in); an hour from its 60 minutes, which are stored too.
``manage.py traffic_sum`` (``sums_ahead``, every five minutes) sums up the last day ahead of the
dashboard; a window that finds a span missing sums it up itself. A record stored or reported
later than that (an answer longer than ``SETTLE_S``, a late beacon) deletes its minute's and
hour's sums, which are then summed up again (``spans_invalidate``). A late record stored in the
very moment its minute is being summed up may be left out of that sum; nothing else is.
``manage.py prune`` deletes sums with the records they sum up.

The TTFTs are counted in the fine bins of ``services/ttft_bins.py``.
"""

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.utils import timezone

from assistant.models import StreamRecord, TrafficSum
from assistant.services.telemetry import SERVER_FAULTS
from assistant.services.ttft_bins import fine_bin

#: A minute is summed up only this long (s) after its end.
SETTLE_S = 300
#: Slowest records kept per path and span (the dashboard lists 10).
SLOWEST_KEPT = 10
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
HOUR_S = 3600
#: Sums older than this go (``sums_ahead``): no window reaches them.
KEEP_SUMS = timedelta(days=2)
#: Annotates a record with whether the browser reported its timings.
REPORTED = ExpressionWrapper(Q(client_reported_at__isnull=False), output_field=BooleanField())
#: What the figures of a path need from each record.
_FIELDS = (
    "path", "server", "created_at", "pk", "outcome", "buffered", "server_ttft_ms",
    "client_ttft_ms", "client_waited_ms", "client_done_ms", "reported",
)  # fmt: skip


def client_ttft_ms(
    *, ttft_ms: float | None, waited_ms: float | None, done_ms: float | None
) -> float:
    """The browser's TTFT (ms): its first token, or, when none came, at least the time waited,
    so that percentiles are not biased toward the requests that survived."""
    if ttft_ms is not None:
        return ttft_ms
    return waited_ms or done_ms or 0.0


def _bins_add(bins: Counter[int], pairs: Iterable[tuple[int, int]]) -> None:
    """Add (bin, count) pairs, each bin once, to ``bins``: the sums in one ``dict.update``,
    twice as fast as ``Counter.update``, which adds them one at a time (the 24 h window merges
    a few hundred parts a snapshot)."""
    get = bins.get
    dict.update(bins, {index: get(index, 0) + count for index, count in pairs})


@dataclass(slots=True)
class PathWindow:
    """What one path's records add up to: those read one by one (exact values), and those
    summed up in minutes (binned values)."""

    requests: int = 0
    errors: int = 0
    abandoned: int = 0
    buffered: int = 0
    buffered_checked: int = 0
    server_ttft_ms: list[float] = field(default_factory=list)
    client_ttft_ms: list[float] = field(default_factory=list)
    server_bins: Counter[int] = field(default_factory=Counter)
    client_bins: Counter[int] = field(default_factory=Counter)
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

    def absorb(self, other: "PathWindow", *, ranked: bool = True) -> None:
        """Add ``other``'s counts, values and bins (and its ranked records, with ``ranked``)."""
        self.requests += other.requests
        self.errors += other.errors
        self.abandoned += other.abandoned
        self.buffered += other.buffered
        self.buffered_checked += other.buffered_checked
        self.server_ttft_ms += other.server_ttft_ms
        self.client_ttft_ms += other.client_ttft_ms
        _bins_add(self.server_bins, other.server_bins.items())
        _bins_add(self.client_bins, other.client_bins.items())
        if ranked:
            self.ranked += other.ranked

    def bin(self) -> None:
        """Move the exact values into the fine bins."""
        self.server_bins.update(map(fine_bin, self.server_ttft_ms))
        self.client_bins.update(map(fine_bin, self.client_ttft_ms))
        self.server_ttft_ms, self.client_ttft_ms = [], []

    def summed(self) -> dict[str, Any]:
        """This window (its values binned, with the bins merged into it) as one path's part of
        a ``TrafficSum`` (JSON; bins and the slowest as flat lists, [bin, count, ...] and [TTFT,
        pk, ...], which decode fastest)."""
        slowest = heapq.nlargest(SLOWEST_KEPT, self.ranked)
        return {
            "requests": self.requests,
            "errors": self.errors,
            "abandoned": self.abandoned,
            "buffered": self.buffered,
            "buffered_checked": self.buffered_checked,
            "server": _flat(
                (Counter(map(fine_bin, self.server_ttft_ms)) + self.server_bins).items()
            ),
            "client": _flat(
                (Counter(map(fine_bin, self.client_ttft_ms)) + self.client_bins).items()
            ),
            "slowest": _flat(slowest),
        }

    def merge(self, summed: dict[str, Any]) -> None:
        """Add one path's part of a ``TrafficSum``."""
        self.requests += summed["requests"]
        self.errors += summed["errors"]
        self.abandoned += summed["abandoned"]
        self.buffered += summed["buffered"]
        self.buffered_checked += summed["buffered_checked"]
        for bins, flat in (
            (self.server_bins, summed["server"]),
            (self.client_bins, summed["client"]),
        ):
            pairs = iter(flat)
            _bins_add(bins, zip(pairs, pairs, strict=True))
        pairs = iter(summed["slowest"])
        self.ranked += zip(pairs, pairs, strict=True)


#: Prefix of a worker server's figures beside the paths': no path has a ":" in its name.
SERVER_GROUP = "server:"


def server_group(server: str) -> str:
    """The key of ``server``'s figures among the paths' (in a ``TrafficSum`` and the
    dashboard's windows)."""
    return SERVER_GROUP + server


def _flat(pairs: Iterable[tuple[float, int]]) -> list[float]:
    return [value for pair in sorted(pairs) for value in pair]


def minute_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def minute_ceil(moment: datetime) -> datetime:
    floor = minute_floor(moment)
    return floor if floor == moment else floor + MINUTE


def _floor(moment: datetime, span_s: int) -> datetime:
    floor = minute_floor(moment)
    return floor.replace(minute=0) if span_s == HOUR_S else floor


def records_read(
    records: Iterable[tuple[Any, ...]], windows: dict[str, PathWindow], *, span_s: int = 0
) -> dict[datetime, dict[str, PathWindow]]:
    """Count rows of ``_FIELDS`` into ``windows``: each into its path's window (none when
    ``windows`` has no window for it) and, when it names its server, into that server's (made
    when missing). With ``span_s`` (60 or 3600): into new windows per span instead (returned),
    their values binned.

    Each record is counted once, into the window of its span, path and server; those are then
    added into the paths' and the servers' windows (a server's without the ranked records,
    which only the paths' slowest use), binned first in a span, so no value is binned twice."""
    pairs: dict[tuple[datetime | None, str, str], PathWindow] = {}
    for (
        path,
        server,
        created,
        pk,
        outcome,
        buffered,
        ttft_s,
        ttft,
        waited,
        done,
        reported,
    ) in records:
        key = (_floor(created, span_s) if span_s else None, path, server)
        if (window := pairs.get(key)) is None:
            window = pairs[key] = PathWindow()
        client = client_ttft_ms(ttft_ms=ttft, waited_ms=waited, done_ms=done) if reported else None
        window.add(pk=pk, outcome=outcome, buffered=buffered, server=ttft_s, client=client)
    spans: dict[datetime, dict[str, PathWindow]] = {}
    for (span, path, server), window in pairs.items():
        if span is None:
            into = windows
        else:
            into = spans.setdefault(span, {})
            window.bin()
        if span is not None or path in windows:
            into.setdefault(path, PathWindow()).absorb(window)
        if server:
            into.setdefault(server_group(server), PathWindow()).absorb(window, ranked=False)
    return spans


def records_in(condition: Q) -> Iterator[tuple[Any, ...]]:
    """Synchronous (ORM), one query: the rows of ``_FIELDS`` of the records matching."""
    rows = StreamRecord.objects.filter(condition).order_by().annotate(reported=REPORTED)
    return rows.values_list(*_FIELDS).iterator(chunk_size=5000)


Span = tuple[datetime, int]


def spans_cover(first: datetime, end: datetime) -> list[Span]:
    """[first, end) (whole minutes) as (start, seconds): the whole hours in it, and minutes
    before and after them."""
    spans: list[Span] = []
    moment = first
    while moment < end:
        span_s = HOUR_S if moment.minute == 0 and moment + HOUR <= end else 60
        spans.append((moment, span_s))
        moment += timedelta(seconds=span_s)
    return spans


def _runs(spans: list[Span]) -> Iterator[tuple[datetime, datetime, int]]:
    """Consecutive spans of one length as [start, end) runs of at most an hour."""
    run: list[Span] = []
    for span in spans:
        start, span_s = span
        if run and (
            span_s != run[0][1]
            or start != run[-1][0] + timedelta(seconds=span_s)
            or start - run[0][0] >= HOUR
        ):
            yield run[0][0], run[-1][0] + timedelta(seconds=run[0][1]), run[0][1]
            run = []
        run.append(span)
    if run:
        yield run[0][0], run[-1][0] + timedelta(seconds=run[0][1]), run[0][1]


def _stored(wanted: Q) -> dict[Span, dict[str, Any]]:
    rows = TrafficSum.objects.filter(wanted).values_list("start", "span_s", "paths")
    return {(start, span_s): paths for start, span_s, paths in rows}


def _minutes_sum(missing: list[datetime]) -> dict[Span, dict[str, Any]]:
    """Sum up the ``missing`` minutes (in order) from their records and store them: one query
    to read and one to write per hour of them."""
    summed: dict[Span, dict[str, Any]] = {}
    for start, end, _ in _runs([(minute, 60) for minute in missing]):
        counted = records_read(
            records_in(Q(created_at__gte=start, created_at__lt=end)), {}, span_s=60
        )
        rows = []
        moment = start
        while moment < end:
            paths = {path: w.summed() for path, w in counted.get(moment, {}).items()}
            summed[moment, 60] = paths
            rows.append(TrafficSum(start=moment, span_s=60, paths=paths))
            moment += MINUTE
        TrafficSum.objects.bulk_create(rows, ignore_conflicts=True)
    return summed


def spans_sum(missing: list[Span]) -> dict[Span, dict[str, Any]]:
    """Synchronous (ORM): sum up the ``missing`` spans (in order) and store them; returns
    {span: its paths}. A minute is summed up from its records; an hour from its 60 minutes
    (those not stored yet summed up first), so that every hour summed up has its minutes too.
    A span summed up at the same time elsewhere is kept as it was."""
    minutes = [start for start, span_s in missing if span_s == 60]
    hours = [start for start, span_s in missing if span_s == HOUR_S]
    in_hours: dict[Span, dict[str, Any]] = {}
    if hours:
        wanted = Q(pk__in=[])
        for hour in hours:
            wanted |= Q(span_s=60, start__gte=hour, start__lt=hour + HOUR)
        in_hours = _stored(wanted)
        minutes += [
            hour + MINUTE * i for hour in hours for i in range(60)
            if (hour + MINUTE * i, 60) not in in_hours
        ]  # fmt: skip
    summed = _minutes_sum(sorted(minutes))
    in_hours.update(summed)
    rows = []
    for hour in hours:
        windows: dict[str, PathWindow] = {}
        for i in range(60):
            for path, part in in_hours[hour + MINUTE * i, 60].items():
                windows.setdefault(path, PathWindow()).merge(part)
        paths = {path: window.summed() for path, window in windows.items()}
        summed[hour, HOUR_S] = paths
        rows.append(TrafficSum(start=hour, span_s=HOUR_S, paths=paths))
    TrafficSum.objects.bulk_create(rows, ignore_conflicts=True)
    return summed


def spans_read(first: datetime, end: datetime) -> list[dict[str, Any]]:
    """Synchronous (ORM): [first, end) (whole minutes) as the paths of the spans covering it,
    hours where whole, summed up where they were not yet."""
    cover = spans_cover(first, end)
    hours = [start for start, span_s in cover if span_s == HOUR_S]
    wanted = Q(span_s=60, start__gte=first, start__lt=end)
    if hours:
        wanted = (
            Q(span_s=60, start__gte=first, start__lt=hours[0])
            | Q(span_s=60, start__gte=hours[-1] + HOUR, start__lt=end)
            | Q(span_s=HOUR_S, start__gte=hours[0], start__lte=hours[-1])
        )
    stored = _stored(wanted)
    missing = [span for span in cover if span not in stored]
    if missing:
        stored.update(spans_sum(missing))
    return [stored[span] for span in cover]


def sums_ahead(*, now: datetime | None = None) -> int:
    """Synchronous (ORM): sum up every settled minute and hour of the last day not summed up
    yet, so that no dashboard waits for it, and delete the sums older than ``KEEP_SUMS`` (a
    dashboard's window is a day at most). Returns how many spans the last day holds."""
    moment = now or timezone.now()
    TrafficSum.objects.filter(start__lt=moment - KEEP_SUMS).delete()
    first = _floor(moment - timedelta(days=1), HOUR_S)
    return len(spans_read(first, minute_floor(moment - timedelta(seconds=SETTLE_S))))


def spans_invalidate(created: Iterable[datetime], *, now: datetime) -> None:
    """Synchronous (ORM): records created at ``created`` were stored or changed at ``now``. The
    minutes and hours of those old enough to have been summed up already are summed up again
    when next asked for (no query when none is)."""
    # A span is summed up at least SETTLE_S after its end; a minute to spare for clocks.
    late = [moment for moment in created if moment < now - timedelta(seconds=SETTLE_S) + MINUTE]
    if late:
        TrafficSum.objects.filter(
            Q(span_s=60, start__in={_floor(m, 60) for m in late})
            | Q(span_s=HOUR_S, start__in={_floor(m, HOUR_S) for m in late})
        ).delete()
