"""What each stream measured: its stored record and its Prometheus observations.

Both happen when a stream ends, from timings taken on the way, so measuring adds nothing to the
path of the first token.
"""

from typing import TYPE_CHECKING

from assistant import metrics
from assistant.models import StreamRecord
from assistant.services.timings import StreamTimings

if TYPE_CHECKING:
    from assistant.services.streaming import ChatStream

#: Outcomes that are the server's fault (a student closing the tab is not).
SERVER_FAULTS = {"engine_error", "timeout", "server_error"}
#: Outcomes whose record keeps the reason as its error code.
_WITH_REASON = SERVER_FAULTS | {"given_up"}


def stream_record(stream: "ChatStream") -> StreamRecord:
    t = stream.timings
    ms = t.as_ms()
    return StreamRecord(
        request_id=stream.exchange.request_id,
        created_at=t.received_at,
        owner_key=stream.identity.owner_key,
        path=stream.path,
        engine=stream.engine.name,
        outcome=stream.outcome,
        error_code=stream.finish_reason if stream.outcome in _WITH_REASON else "",
        conversation_id=stream.exchange.conversation_id,
        message_id=stream.exchange.answer_message_id,
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
    path: str,
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
        path=path,
        engine=engine,
        outcome=StreamRecord.Outcome.ENGINE_ERROR,
        error_code=reason,
        parse_ms=ms["parsed"],
    )


def stream_started(*, path: str, engine: str) -> None:
    metrics.STREAMS_ACTIVE.labels(path, engine).inc()


def stream_observe(stream: "ChatStream") -> None:
    """Count and time a finished stream (called once, when it ends)."""
    t, path, engine = stream.timings, stream.path, stream.engine.name
    metrics.STREAMS_ACTIVE.labels(path, engine).dec()
    metrics.STREAMS.labels(path, engine, stream.outcome).inc()
    if stream.outcome in SERVER_FAULTS:
        metrics.CONNECTION_ERRORS.labels(path, stream.finish_reason or stream.outcome).inc()
    if t.first_token_sent:
        metrics.TTFT.labels(path, engine, "server").observe(t.first_token_sent - t.received)
    if t.engine_first_delta and t.engine_submitted:
        metrics.ENGINE_TTFT.labels(path, engine).observe(t.engine_first_delta - t.engine_submitted)
    inter_token = metrics.INTER_TOKEN.labels(path, engine)
    for gap in t.gaps:
        inter_token.observe(gap)
    if t.tokens:
        metrics.TOKENS.labels(path, engine).inc(t.tokens)
    metrics.STREAM_DURATION.labels(path, engine, stream.outcome).observe(t.finished - t.received)


def stream_refused(*, path: str, engine: str, reason: str) -> None:
    """A stream that could not start (503): an error to the student, so counted as one."""
    metrics.STREAMS.labels(path, engine, "engine_error").inc()
    metrics.CONNECTION_ERRORS.labels(path, reason).inc()
