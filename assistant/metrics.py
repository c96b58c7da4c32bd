"""Every Prometheus metric chatsite exports, defined once, at import.

Label values are bounded: ``path`` is a serving path name (``direct``, ``django``, ``api``),
``engine`` an engine name, ``source`` ``server`` or ``client``, ``server`` the HTTP server the
answer was streamed by (``daphne``, ``uvicorn``, or empty for a worker that named none:
``assistant.worker``), ``outcome`` and ``reason`` short fixed codes. Never a user, session or
request id.

Several Daphne workers: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory (wiped before the
workers start); prometheus_client then keeps each process's values in files there and
``/metrics`` (django-prometheus) adds them up. The active-streams gauge sums live processes.
"""

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from assistant.internals import histogram_values


def _ttft_buckets() -> tuple[float, ...]:
    """Geometric from 5 ms to 10 s, each edge at most 15 % above the last (so a 20 % change always
    crosses an edge), plus 0.5 s exactly for the HighTTFT alert."""
    edges = [0.005]
    while edges[-1] < 10:
        edges.append(edges[-1] * 1.149)
    return tuple(sorted({round(e, 6) for e in edges} | {0.5}))


TTFT_BUCKETS = _ttft_buckets()
GAP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1,
    2.5,
    5,
)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)

TTFT = Histogram(
    "ai_ttft_seconds",
    "Time to first token: server (request received to first token sent) or client "
    "(fetch sent to first token rendered; abandoned requests count the time waited).",
    ["path", "engine", "source", "server"],
    buckets=TTFT_BUCKETS,
)
ENGINE_TTFT = Histogram(
    "ai_engine_ttft_seconds",
    "Engine time to first token: request handed to the engine to its first delta.",
    ["path", "engine"],
    buckets=TTFT_BUCKETS,
)
INTER_TOKEN = Histogram(
    "ai_inter_token_seconds",
    "Gap between consecutive token sends of one stream.",
    ["path", "engine", "server"],
    buckets=GAP_BUCKETS,
)
STREAM_DURATION = Histogram(
    "ai_stream_duration_seconds",
    "Stream duration, request received to last frame.",
    ["path", "engine", "outcome", "server"],
    buckets=DURATION_BUCKETS,
)
STREAMS = Counter(
    "ai_streams_total",
    "Chat streams started, by how they ended (ok, client_abort, engine_error, timeout).",
    ["path", "engine", "outcome", "server"],
)
CONNECTION_ERRORS = Counter(
    "ai_sse_connection_errors_total",
    "Streams that failed on the server's side (engine_unavailable, engine_error, server_error, "
    "...); a client leaving is not an error.",
    ["path", "reason"],
)
STREAMS_ACTIVE = Gauge(
    "ai_streams_active",
    "Chat streams open now.",
    ["path", "engine", "server"],
    multiprocess_mode="livesum",
)
TOKENS = Counter("ai_tokens", "Tokens streamed to clients.", ["path", "engine"])
PERSISTENCE_FAILURES = Counter(
    "ai_persistence_failures",
    "Writes of questions, answers and stream records that failed: retried (the database was "
    "unreachable, tried again) or lost (given up, logged with the rows).",
    ["kind"],
)
# Written by the model process's supervisor (python -m assistant.modelhost) into the same
# multiprocess directory, so every worker's /metrics shows them.
MODEL_PROCESS_RESTARTS = Counter(
    "ai_model_process_restarts",
    "Times the embedded model's process ended and was started again, by how it ended "
    "(SIGSEGV, SIGKILL, SIGABRT, ..., signal, exit, load_failed).",
    ["reason"],
)
MODEL_PROCESS_UP = Gauge(
    "ai_model_process_up",
    "1 while the embedded model's process is loaded and answering.",
    multiprocess_mode="livemax",
)
REJECTIONS = Counter(
    "ai_rejections",
    "Requests refused before an answer started, by error code (session_required, "
    "new_sessions_limited, address_busy, rate_limited, stream_active, engine_busy, csrf_failed, "
    "invalid_json, ...): floods show here.",
    ["reason"],
)
STREAMS_GIVEN_UP = Counter(
    "ai_streams_given_up",
    "Answers stopped to let another request onto a full engine: unheard (nobody was listening "
    "any more) or fair_share (its address held more than its share of the engine).",
    ["reason"],
)


#: Each metric's labelled children looked up so far, by metric and label values.
_children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}


def child[M: MetricWrapperBase](metric: M, *values: str) -> M:
    """``metric.labels(*values)``, looked up once per process and kept: ``labels()`` checks its
    arguments and takes the metric's lock on every call, and an answer makes eight. The label
    values are bounded (see the module docstring), so what is kept is too."""
    key = (metric, values)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*values)
    return found


def observe_all(histogram: Histogram, amounts: Sequence[float]) -> None:
    """``histogram.observe(amount)`` for each of ``amounts``, as one update: the sum and each
    bucket reached are incremented once, by their totals. An answer's gaps between tokens are
    observed this way when it ends, not one by one (each ``observe`` takes the sum's lock and
    a bucket's, a write to the shared file in multiprocess mode). ``histogram`` is a labelled
    child (``.labels(...)``); what ``observe`` updates comes from ``internals.histogram_values``."""
    if not amounts:
        return
    bounds, total, buckets = histogram_values(histogram)
    counts: dict[int, int] = {}
    for amount in amounts:  # observe()'s bucket: the first bound at or above the amount
        i = bisect_left(bounds, amount)
        counts[i] = counts.get(i, 0) + 1
    total.inc(sum(amounts))
    for i, n in counts.items():
        buckets[i].inc(n)
