"""TTFTs counted in fine bins, from which the dashboard's histogram and percentiles are taken.

The fine bins split each of the dashboard's bins (``HISTOGRAM_EDGES_MS``) into ``SPLIT``, so the
histogram adds them up exactly: [0, 10 ms) in steps of 0.1 ms, then 16 steps of about 1.8 % per
dashboard bin up to 10 s, then steps of the same ratio beyond. Percentiles from bins place the
values of a bin evenly across it: within 0.05 ms below 10 ms, within a bin's 1.8 % above.
"""

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable

#: TTFT histogram bin edges (ms): [0, 10), then 8 bins per decade up to 10 s, each edge about
#: 33 % above the last. Values at or above the last edge are counted in the last bin.
HISTOGRAM_EDGES_MS: tuple[float, ...] = (0.0, *(round(10 * 10 ** (i / 8), 1) for i in range(25)))
#: Fine bins per dashboard bin above 10 ms; below it, bins of ``LOW_STEP_MS``.
SPLIT = 16
LOW_STEP_MS = 0.1
_LOW_BINS = round(HISTOGRAM_EDGES_MS[1] / LOW_STEP_MS)
_LOG_BINS = (len(HISTOGRAM_EDGES_MS) - 2) * SPLIT
_TOP_MS = HISTOGRAM_EDGES_MS[-1]
_TOP_STEP = math.log(10) / (8 * SPLIT)
#: Beyond this (15 min) a value shares the last fine bin.
_MAX_MS = 15 * 60 * 1000.0
_MAX_BIN = _LOW_BINS + _LOG_BINS + int(math.log(_MAX_MS / _TOP_MS) / _TOP_STEP)


def fine_bin(value: float) -> int:
    """The fine bin of a TTFT (ms); below 0 counts in the first, beyond 15 min in the last."""
    if value < HISTOGRAM_EDGES_MS[1]:
        return max(0, int(value / LOW_STEP_MS))
    if value >= _TOP_MS:
        return min(_MAX_BIN, _LOW_BINS + _LOG_BINS + int(math.log(value / _TOP_MS) / _TOP_STEP))
    coarse = bisect_right(HISTOGRAM_EDGES_MS, value) - 1
    low, high = HISTOGRAM_EDGES_MS[coarse], HISTOGRAM_EDGES_MS[coarse + 1]
    step = min(SPLIT - 1, int(SPLIT * math.log(value / low) / math.log(high / low)))
    return _LOW_BINS + (coarse - 1) * SPLIT + step


def fine_bounds(index: int) -> tuple[float, float]:
    """[low, high) of a fine bin, in ms."""
    if index < _LOW_BINS:
        return index * LOW_STEP_MS, (index + 1) * LOW_STEP_MS
    if index >= _LOW_BINS + _LOG_BINS:
        beyond = index - _LOW_BINS - _LOG_BINS
        return _TOP_MS * math.exp(beyond * _TOP_STEP), _TOP_MS * math.exp((beyond + 1) * _TOP_STEP)
    coarse, step = divmod(index - _LOW_BINS, SPLIT)
    low, high = HISTOGRAM_EDGES_MS[coarse + 1], HISTOGRAM_EDGES_MS[coarse + 2]
    ratio = high / low
    return low * ratio ** (step / SPLIT), low * ratio ** ((step + 1) / SPLIT)


def coarse_bin(index: int) -> int:
    """The dashboard bin a fine bin falls in."""
    if index < _LOW_BINS:
        return 0
    return min(len(HISTOGRAM_EDGES_MS) - 2, 1 + (index - _LOW_BINS) // SPLIT)


def binned_histogram(bins: Counter[int]) -> list[int]:
    """Counts per dashboard bin, from fine bins."""
    counts = [0] * (len(HISTOGRAM_EDGES_MS) - 1)
    for index, count in bins.items():
        counts[coarse_bin(index)] += count
    return counts


def binned_percentiles(bins: Counter[int], qs: Iterable[float]) -> list[float | None]:
    """Percentiles as numpy's default method takes them (interpolating between ranks), with the
    values of each fine bin spread evenly across it."""
    total = sum(bins.values())
    if not total:
        return [None for _ in qs]
    ordered = sorted(bins.items())

    def nth(rank: int) -> float:  # the rank-th smallest value (0-based)
        seen = 0
        for index, count in ordered:
            if rank < seen + count:
                low, high = fine_bounds(index)
                return low + (high - low) * (rank - seen + 0.5) / count
            seen += count
        raise AssertionError("rank beyond the count")

    result: list[float | None] = []
    for q in qs:
        rank = (total - 1) * q / 100
        low, high = math.floor(rank), math.ceil(rank)
        below = nth(low)
        result.append(below + (nth(high) - below) * (rank - low))
    return result
