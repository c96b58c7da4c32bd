"""Samples reduced to percentiles and throughput, as ``vllm bench serve`` reports them."""

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .runner import RunResult


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolating linearly between closest ranks: numpy's
    default method, which ``vllm bench serve`` uses."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Distribution | None":
        if not values:
            return None
        p50, p95, p99 = (round(percentile(values, q), 3) for q in (50, 95, 99))
        return cls(len(values), round(statistics.fmean(values), 3), p50, p95, p99, max(values))


@dataclass(frozen=True, slots=True)
class Summary:
    """Latencies in ms over the successful requests (as vLLM's); outcomes over all of them."""

    requests: int
    ok: int
    outcomes: dict[str, int]
    duration_s: float
    request_throughput: float  # successful requests per second
    token_throughput: float  # their tokens per second
    headers_ms: Distribution | None
    ttfb_ms: Distribution | None
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    server_ttft_ms_p50: float | None
    engine_ttft_ms_p50: float | None
    client_minus_server_ttft_ms_p50: float | None


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(result: RunResult) -> Summary:
    ok = [s for s in result.samples if s.outcome == "ok"]

    def present(values: Iterable[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    duration = result.duration_s or math.inf
    return Summary(
        requests=len(result.samples),
        ok=len(ok),
        outcomes=dict(Counter(s.label for s in result.samples).most_common()),
        duration_s=round(result.duration_s, 3),
        request_throughput=round(len(ok) / duration, 3),
        token_throughput=round(sum(s.tokens for s in ok) / duration, 3),
        headers_ms=Distribution.of(present(s.headers_ms for s in ok)),
        ttfb_ms=Distribution.of(present(s.ttfb_ms for s in ok)),
        ttft_ms=Distribution.of(present(s.ttft_ms for s in ok)),
        itl_ms=Distribution.of([gap for s in ok for gap in s.itl_ms]),
        tpot_ms=Distribution.of(present(s.tpot_ms for s in ok)),
        e2e_ms=Distribution.of(present(s.e2e_ms for s in ok)),
        server_ttft_ms_p50=_median(present(s.server_ttft_ms for s in ok)),
        engine_ttft_ms_p50=_median(present(s.engine_ttft_ms for s in ok)),
        client_minus_server_ttft_ms_p50=_median(
            [
                s.ttft_ms - s.server_ttft_ms
                for s in ok
                if s.ttft_ms is not None and s.server_ttft_ms is not None
            ]
        ),
    )
