"""What each answer measured: its stored record and its Prometheus observations.

Both happen when an answer ends, from timings taken on the way, so measuring adds nothing to the
path of the first token. They take an ``AnswerSummary``, a small record of what the answer was,
not the answer itself: telemetry depends on nothing that runs answers.
"""

import uuid
from dataclasses import dataclass

from assistant import metrics
from assistant.models import StreamRecord
from assistant.services.timings import StreamTimings

Outcome = StreamRecord.Outcome

#: Outcomes that are the server's fault (a student closing the tab is not).
SERVER_FAULTS = frozenset({Outcome.ENGINE_ERROR, Outcome.TIMEOUT, Outcome.SERVER_ERROR})
#: Outcomes whose record keeps the reason as its error code.
_WITH_REASON = SERVER_FAULTS | {Outcome.GIVEN_UP}


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


def stream_record(summary: AnswerSummary) -> StreamRecord:
    t = summary.timings
    ms = t.as_ms()
    return StreamRecord(
        request_id=summary.request_id,
        created_at=t.received_at,
        owner_key=summary.owner_key,
        classroom_id=summary.classroom_id,
        path=summary.serving_path,
        engine=summary.engine,
        outcome=summary.outcome,
        error_code=summary.error_code if summary.outcome in _WITH_REASON else "",
        conversation_id=summary.conversation_id,
        message_id=summary.message_id,
        tokens=t.tokens,
        parse_ms=ms["parsed"],
        queue_ms=ms["queue"],
        engine_ttft_ms=ms["engine_ttft"],
        server_ttft_ms=ms["server_ttft"],
        itl_mean_ms=ms["inter_token_mean"],
        itl_max_ms=ms["inter_token_max"],
        e2e_ms=ms["finished"],
        server_span_ms=ms["span"],
        server_burst_gaps=t.burst_gaps() if t.tokens else None,
    )


def refused_record(
    *,
    request_id: str,
    owner_key: str,
    classroom_id: uuid.UUID | None,
    serving_path: str,
    engine: str,
    reason: str,
    timings: StreamTimings,
) -> StreamRecord:
    """The record of a stream the engine could not take (answered 503)."""
    ms = timings.as_ms()
    return StreamRecord(
        request_id=request_id,
        created_at=timings.received_at,
        owner_key=owner_key,
        classroom_id=classroom_id,
        path=serving_path,
        engine=engine,
        outcome=Outcome.ENGINE_ERROR,
        error_code=reason,
        parse_ms=ms["parsed"],
    )


def stream_started(*, serving_path: str, engine: str) -> None:
    metrics.STREAMS_ACTIVE.labels(serving_path, engine).inc()


def stream_observe(summary: AnswerSummary) -> None:
    """Count and time an ended answer (called once, when it ends)."""
    t, path, engine, outcome = (
        summary.timings,
        summary.serving_path,
        summary.engine,
        summary.outcome,
    )
    metrics.STREAMS_ACTIVE.labels(path, engine).dec()
    metrics.STREAMS.labels(path, engine, outcome.value).inc()
    if outcome in SERVER_FAULTS:
        metrics.CONNECTION_ERRORS.labels(path, summary.error_code or outcome.value).inc()
    if t.first_token_sent:
        metrics.TTFT.labels(path, engine, "server").observe(t.first_token_sent - t.received)
    if t.engine_first_delta and t.engine_submitted:
        metrics.ENGINE_TTFT.labels(path, engine).observe(t.engine_first_delta - t.engine_submitted)
    inter_token = metrics.INTER_TOKEN.labels(path, engine)
    for gap in t.gaps:
        inter_token.observe(gap)
    if t.tokens:
        metrics.TOKENS.labels(path, engine).inc(t.tokens)
    metrics.STREAM_DURATION.labels(path, engine, outcome.value).observe(t.finished - t.received)


def stream_refused(*, serving_path: str, engine: str, reason: str) -> None:
    """A stream that could not start (503): an error to the student, so counted as one."""
    metrics.STREAMS.labels(serving_path, engine, Outcome.ENGINE_ERROR.value).inc()
    metrics.CONNECTION_ERRORS.labels(serving_path, reason).inc()
