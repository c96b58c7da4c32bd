"""Client-side latency of the chat stream, measured the way a browser experiences it.

A :class:`Student` is one browser: its own cookie jar, ``GET /`` once for the CSRF cookie and the
session, then one ``POST`` per question with the ``X-CSRFToken`` header, the same-origin
``Origin`` and ``Referer``, and a new TCP (and TLS) connection per question unless ``keepalive``.
Every time is ``time.perf_counter()`` since just before the request is sent, connection set-up
included:

* ``headers_ms``: the status line and headers parsed;
* ``ttfb_ms``: the first byte of the body (the server's ``: open`` comment);
* ``ttft_ms``: the first ``event: token`` frame fully received (its terminating blank line read);
* ``itl_ms``: the gaps between consecutive token frames;
* ``e2e_ms``: the ``done`` or ``error`` event, or the end of the stream.

:func:`run_benchmark` drives students in a closed loop (C students, each asking again as soon as
its answer ends) or an open loop (arrivals at a fixed rate, Poisson or evenly spaced, whatever the
server's speed), and :func:`summarize` reduces the samples to percentiles and throughput.
"""

from .client import STREAM_PATHS, BenchmarkError, EndpointNotFound, Sample
from .frames import SSEEvent, SSEParser
from .runner import LoadPlan, RunResult, run_benchmark
from .stats import Distribution, Summary, percentile, summarize

__all__ = [
    "STREAM_PATHS",
    "BenchmarkError",
    "Distribution",
    "EndpointNotFound",
    "LoadPlan",
    "RunResult",
    "SSEEvent",
    "SSEParser",
    "Sample",
    "Summary",
    "percentile",
    "run_benchmark",
    "summarize",
]
