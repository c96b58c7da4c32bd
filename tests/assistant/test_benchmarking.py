"""The benchmark's pure parts: the incremental event-stream parser and the statistics."""

import random

import numpy
import pytest

from assistant.benchmarking import (
    Distribution,
    LoadPlan,
    RunResult,
    Sample,
    SSEEvent,
    SSEParser,
    percentile,
    summarize,
)
from assistant.sse import encode_comment, encode_event, encode_json_event

# Frames as the server writes them, with non-ASCII text (multi-byte in UTF-8) and a data value
# spread over two lines; ``None`` marks frames that dispatch no event.
FRAMES: list[tuple[bytes, SSEEvent | None]] = [
    (encode_comment("open"), None),
    (
        encode_json_event({"request_id": "r1"}, event="meta"),
        SSEEvent("meta", '{"request_id":"r1"}', None),
    ),
    (
        encode_json_event({"text": "Photo"}, event="token", id="1"),
        SSEEvent("token", '{"text":"Photo"}', "1"),
    ),
    (
        encode_json_event({"text": " synthèse 光合作用"}, event="token", id="2"),
        SSEEvent("token", '{"text":" synthèse 光合作用"}', "2"),
    ),
    (encode_comment("ping"), None),
    (encode_event("line one\nline two", id="3"), SSEEvent("message", "line one\nline two", "3")),
    (encode_json_event({"tokens": 2}, event="done"), SSEEvent("done", '{"tokens":2}', "3")),
]


def stream(newline: bytes) -> tuple[bytes, list[SSEEvent], list[int]]:
    """The frames with ``newline`` line ends; the events; the offset at which each event's frame
    is complete (a CR already ends the blank line of a CRLF frame)."""
    body, events, complete_at = b"", [], []
    for frame, event in FRAMES:
        body += frame.replace(b"\n", newline)
        if event is not None:
            events.append(event)
            complete_at.append(len(body) - (len(newline) - 1))
    return body, events, complete_at


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_parser_gives_each_event_once_its_frame_is_complete_whatever_the_split(
    newline: bytes,
) -> None:
    """Cut anywhere (inside a line, a UTF-8 character or a CRLF), the events are the same, and
    each is returned by the read that completes its frame, not before and not later."""
    body, events, complete_at = stream(newline)
    for cut in range(len(body) + 1):
        parser = SSEParser()
        first = parser.feed(body[:cut])
        rest = parser.feed(body[cut:])
        assert first + rest == events, cut
        assert len(first) == sum(at <= cut for at in complete_at), cut


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_parser_fed_one_byte_at_a_time(newline: bytes) -> None:
    """Byte by byte, every event appears exactly at the byte that completes its frame."""
    body, events, complete_at = stream(newline)
    parser = SSEParser()
    seen: list[tuple[int, SSEEvent]] = []
    for offset in range(len(body)):
        seen += [(offset + 1, event) for event in parser.feed(body[offset : offset + 1])]
    assert seen == list(zip(complete_at, events, strict=True))


def test_parser_ignores_comments_and_frames_without_data() -> None:
    """Comments, data-less frames and unknown fields dispatch nothing and leak into nothing."""
    parser = SSEParser()
    body = b": open\n\nevent: token\n\nretry: 10\nfoo: bar\n\ndata:x\n\n"
    assert parser.feed(body) == [SSEEvent("message", "x", None)]
    assert parser.feed(b"data: partial") == []


def test_percentile_interpolates_like_numpy() -> None:
    """Linear interpolation between ranks: the figures ``vllm bench serve`` prints."""
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    rng = random.Random(7)
    for size in (2, 3, 10, 101, 1000):
        values = [rng.lognormvariate(5, 0.5) for _ in range(size)]
        for q in (0, 50, 90, 95, 99, 100):
            assert percentile(values, q) == pytest.approx(numpy.percentile(values, q))
    with pytest.raises(ValueError):
        percentile([], 50)


def sample(i: int, **fields: object) -> Sample:
    return Sample(index=i, worker=0, prompt_index=0, **fields)  # type: ignore[arg-type]


def test_summary_counts_outcomes_and_reduces_successful_requests() -> None:
    """Latencies come from the successful requests only; ITLs are pooled across them; TPOT is
    (E2E - TTFT) / (tokens - 1); throughput divides by the run's duration."""
    samples = [
        sample(
            0,
            outcome="ok",
            ttft_ms=100.0,
            e2e_ms=190.0,
            tokens=4,
            itl_ms=[30.0, 30.0, 30.0],
            server_ttft_ms=95.0,
            engine_ttft_ms=90.0,
        ),
        sample(
            1,
            outcome="ok",
            ttft_ms=200.0,
            e2e_ms=220.0,
            tokens=3,
            itl_ms=[10.0, 10.0],
            server_ttft_ms=180.0,
            engine_ttft_ms=170.0,
        ),
        sample(
            2,
            outcome="error_event",
            error="engine_error",
            ttft_ms=5000.0,
            e2e_ms=6000.0,
            tokens=2,
            itl_ms=[1000.0],
        ),
        sample(3, outcome="http_error", error="403 csrf_failed", status=403, e2e_ms=3.0),
        sample(4, outcome="timeout"),
    ]
    summary = summarize(
        RunResult(plan=LoadPlan("http://x", ["q"], 5), samples=samples, duration_s=2.0)
    )
    assert summary.requests == 5 and summary.ok == 2
    assert summary.outcomes == {
        "ok": 2,
        "error_event: engine_error": 1,
        "http_error: 403 csrf_failed": 1,
        "timeout": 1,
    }
    assert summary.ttft_ms == Distribution(2, 150.0, 150.0, 195.0, 199.0, 200.0)
    assert summary.itl_ms is not None and summary.itl_ms.count == 5
    assert summary.itl_ms.max == 30.0
    assert samples[0].tpot_ms == 30.0 and samples[1].tpot_ms == 10.0
    assert summary.tpot_ms is not None and summary.tpot_ms.mean == 20.0
    assert summary.request_throughput == 1.0
    assert summary.token_throughput == 3.5
    assert summary.server_ttft_ms_p50 == 137.5
    assert summary.engine_ttft_ms_p50 == 130.0
    assert summary.client_minus_server_ttft_ms_p50 == 12.5
    assert summary.ttfb_ms is None


def test_one_token_has_no_tpot_and_json_rows_carry_it() -> None:
    """TPOT needs two tokens; each sample's JSON row includes its TPOT."""
    assert sample(0, outcome="ok", ttft_ms=10.0, e2e_ms=20.0, tokens=1).tpot_ms is None
    row = sample(1, outcome="ok", ttft_ms=10.0, e2e_ms=20.0, tokens=3).as_dict()
    assert row["tpot_ms"] == 5.0 and row["tokens"] == 3 and row["outcome"] == "ok"
