"""What each answer measured: its stored record, its Prometheus observations and its log line.

All three come from timings taken on the way, after the answer's last frame, so measuring adds
nothing to the path of the first token. The record goes to the group writer as the answer ends;
the metrics and the log line wait for the others ending within ``ENDS_BATCH_S`` and are made for
all of them at once (``stream_observe``). They take an ``AnswerSummary``, a small record of what
the answer was, not the answer itself: telemetry depends on nothing that runs answers.

The log line (``stream ended`` on the ``assistant.streams`` logger, at INFO) carries the stored
record's figures under the same names, keyed by the request id nginx logs too
(docs/monitoring.md). It names the kind of owner only (``session``, ``user``, ``key``), never
the owner key: a log is read by more people than the database, and kept longer.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from assistant import metrics
from assistant.logs import record_at
from assistant.models import StreamRecord
from assistant.services.table_rows import Row
from assistant.services.timings import StreamTimings
from assistant.worker import server_name

Outcome = StreamRecord.Outcome

#: Outcomes that are the server's fault (a student closing the tab is not).
SERVER_FAULTS = frozenset({Outcome.ENGINE_ERROR, Outcome.TIMEOUT, Outcome.SERVER_ERROR})
#: Outcomes whose record keeps the reason as its error code.
_WITH_REASON = SERVER_FAULTS | {Outcome.GIVEN_UP}

streams_log = logging.getLogger("assistant.streams")
#: Seconds an ended answer waits to be observed with the others ending meanwhile
#: (``stream_observe``): its metrics and its log line are that much late at most.
ENDS_BATCH_S = 0.2


@dataclass(frozen=True, slots=True)
class AnswerSummary:
    """One ended answer, as its record and its metrics see it."""

    request_id: str
    owner_key: str
    classroom_id: uuid.UUID | None
    serving_path: str
    engine: str
    outcome: Outcome
    #: Why it ended early ("" when it did not): an engine's or the catalogue's error code.
    error_code: str
    conversation_id: uuid.UUID
    message_id: uuid.UUID
    timings: StreamTimings
    #: ``timings``' stages as the record and the log line name them, worked out once for both.
    stages: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", _stages(self.timings))


def _stages(t: StreamTimings) -> dict[str, Any]:
    """The server's stage timings (ms) and token figures, named as StreamRecord's fields."""
    ms = t.as_ms()
    return {
        "tokens": t.tokens,
        "parse_ms": ms["parsed"],
        "queue_ms": ms["queue"],
        "engine_ttft_ms": ms["engine_ttft"],
        "server_ttft_ms": ms["server_ttft"],
        "itl_mean_ms": ms["inter_token_mean"],
        "itl_max_ms": ms["inter_token_max"],
        "e2e_ms": ms["finished"],
        "server_span_ms": ms["span"],
        "server_burst_gaps": t.burst_gaps() if t.tokens else None,
    }


def _error_code(outcome: Outcome, code: str) -> str:
    return code if outcome in _WITH_REASON else ""


def stream_record(summary: AnswerSummary) -> Row:
    """An ended answer's ``StreamRecord`` row (``table_rows``)."""
    t = summary.timings
    return {
        "request_id": summary.request_id,
        "created_at": t.received_at,
        "owner_key": summary.owner_key,
        "classroom_id": summary.classroom_id,
        "path": summary.serving_path,
        "engine": summary.engine,
        "server": server_name(),
        "outcome": summary.outcome,
        "error_code": _error_code(summary.outcome, summary.error_code),
        "conversation_id": summary.conversation_id,
        "message_id": summary.message_id,
        **summary.stages,
    }


def refused_record(
    *,
    request_id: str,
    owner_key: str,
    classroom_id: uuid.UUID | None,
    serving_path: str,
    engine: str,
    reason: str,
    timings: StreamTimings,
) -> Row:
    """The ``StreamRecord`` row of a stream the engine could not take (answered 503)."""
    return {
        "request_id": request_id,
        "created_at": timings.received_at,
        "owner_key": owner_key,
        "classroom_id": classroom_id,
        "path": serving_path,
        "engine": engine,
        "server": server_name(),
        "outcome": Outcome.ENGINE_ERROR,
        "error_code": reason,
        "parse_ms": timings.as_ms()["parsed"],
    }


def stream_started(*, serving_path: str, engine: str) -> None:
    metrics.child(metrics.STREAMS_ACTIVE, serving_path, engine, server_name()).inc()


@dataclass(slots=True)
class _Ends:
    """The answers ended and not yet observed (each with when it ended, ``time.time()``), and
    the flush they wait for on the event loop they ended on."""

    pending: list[tuple[AnswerSummary, float]] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None
    timer: asyncio.TimerHandle | None = None


_ends = _Ends()


def stream_observe(summary: AnswerSummary) -> None:
    """Count, time and log an ended answer (called once, when it ends: after its last frame).

    On an event loop the answer joins those that ended in the last ``ENDS_BATCH_S`` and all are
    observed together (``ends_flush``): each metric is updated once for the batch, by its totals,
    and the log lines are written one after the other, each with its own answer's end time.
    Work done for many answers in one go stays in the processor's caches, where done once an
    answer it is fetched afresh each time (docs/performance.md). Without a running loop (a
    thread, a management command) it is observed at once."""
    ended = (summary, time.time())
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        _observe((ended,))
        return
    if _ends.loop is not loop:
        ends_flush()  # what a loop left that stopped before its flush (tests run many loops)
    if _ends.timer is None:
        _ends.loop, _ends.timer = loop, loop.call_later(ENDS_BATCH_S, ends_flush)
    _ends.pending.append(ended)


def ends_flush() -> int:
    """Observe the ended answers waiting (``stream_observe``) now; how many there were. Also
    called as a worker stops (``assistant/lifespan.py``), after its last answers are stored."""
    timer, _ends.timer = _ends.timer, None
    if timer is not None and _ends.loop is not None and not _ends.loop.is_closed():
        # Cancelled on its own loop only: not from another one, nor with none running (a test).
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is _ends.loop:
                timer.cancel()
    ended, _ends.pending = _ends.pending, []
    if ended:
        _observe(ended)
    return len(ended)


def _observe(ended: Sequence[tuple[AnswerSummary, float]]) -> None:
    """The metrics of ``ended`` (answers and the times they ended), each updated once by its
    totals, then their log lines."""
    child, server = metrics.child, server_name()
    counts: Counter[tuple[Any, tuple[str, ...]]] = Counter()
    amounts: defaultdict[tuple[Any, tuple[str, ...]], list[float]] = defaultdict(list)
    for summary, _ in ended:
        t, path, engine, outcome = (
            summary.timings,
            summary.serving_path,
            summary.engine,
            summary.outcome,
        )
        counts[metrics.STREAMS_ACTIVE, (path, engine, server)] -= 1
        counts[metrics.STREAMS, (path, engine, outcome.value, server)] += 1
        if outcome in SERVER_FAULTS:
            counts[metrics.CONNECTION_ERRORS, (path, summary.error_code or outcome.value)] += 1
        if t.first_token_sent:
            amounts[metrics.TTFT, (path, engine, "server", server)].append(
                t.first_token_sent - t.received
            )
        if t.engine_first_delta and t.engine_submitted:
            amounts[metrics.ENGINE_TTFT, (path, engine)].append(
                t.engine_first_delta - t.engine_submitted
            )
        if t.gaps:
            amounts[metrics.INTER_TOKEN, (path, engine, server)].extend(t.gaps)
        if t.tokens:
            counts[metrics.TOKENS, (path, engine)] += t.tokens
        amounts[metrics.STREAM_DURATION, (path, engine, outcome.value, server)].append(
            t.finished - t.received
        )
    for (metric, labels), count in counts.items():
        child(metric, *labels).inc(count)  # a gauge's too: the streams that ended, taken off
    for (metric, labels), observed in amounts.items():
        metrics.observe_all(child(metric, *labels), observed)
    for summary, at in ended:
        stream_log(
            request_id=summary.request_id,
            serving_path=summary.serving_path,
            engine=summary.engine,
            classroom_id=summary.classroom_id,
            owner_key=summary.owner_key,
            outcome=summary.outcome,
            error_code=_error_code(summary.outcome, summary.error_code),
            stages=summary.stages,
            at=at,
        )


def stream_refused(
    *, request_id: str, serving_path: str, engine: str, reason: str, timings: StreamTimings
) -> None:
    """A stream that could not start (503): an error to the student, so counted as one, and
    logged like an ended answer (its asker is not known yet: no class, no owner kind)."""
    failed = Outcome.ENGINE_ERROR.value
    metrics.child(metrics.STREAMS, serving_path, engine, failed, server_name()).inc()
    metrics.child(metrics.CONNECTION_ERRORS, serving_path, reason).inc()
    stream_log(
        request_id=request_id,
        serving_path=serving_path,
        engine=engine,
        classroom_id=None,
        owner_key="",
        outcome=Outcome.ENGINE_ERROR,
        error_code=reason,
        stages=_stages(timings),
        at=time.time(),
    )


def owner_kind(owner_key: str) -> str | None:
    """What kind of owner ``owner_key`` names (``session``, ``user``, ``key``), without naming
    it; None when there is none."""
    kind, found, _ = owner_key.partition(":")
    return kind if found else None


def stream_log(
    *,
    request_id: str,
    serving_path: str,
    engine: str,
    classroom_id: uuid.UUID | None,
    owner_key: str,
    outcome: Outcome,
    error_code: str,
    stages: dict[str, Any],
    at: float,
) -> None:
    """Write the ``stream ended`` line of one stream, with its ``stages`` (``_stages``; see the
    module docstring), timed ``at`` (``time.time()`` as it ended). Never raises: it runs while
    an answer closes."""
    if not streams_log.isEnabledFor(logging.INFO):
        return
    try:
        fields = {
            "request_id": request_id,
            "path": serving_path,
            "engine": engine,
            "server": server_name(),
            "classroom": str(classroom_id) if classroom_id else None,
            "owner_kind": owner_kind(owner_key),
            "outcome": outcome.value,
            "error_code": error_code,
            **stages,
        }
        streams_log.handle(record_at(streams_log, "stream ended", fields, at))
    except Exception:
        streams_log.exception("Could not log the end of %s", request_id)
