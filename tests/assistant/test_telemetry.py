"""Stage timings, the browser beacon and /metrics, over real HTTP against Daphne."""

import math
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from assistant.models import StreamRecord
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def record_of(request_id: str) -> StreamRecord:
    return wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).first())


def send_beacon(client: ChatClient, payload: dict, *, token: str | None = None) -> httpx.Response:
    """As navigator.sendBeacon sends it: text/plain, the CSRF token in the body, no header."""
    body = {**payload, "csrf_token": client.csrf_token if token is None else token}
    return client.client.post(
        "/api/chat/beacon",
        content=httpx.Request("POST", "/", json=body).content,
        headers={"Content-Type": "text/plain;charset=UTF-8"},
    )


def metric_samples(server: LiveServer) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(server.url + "/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_stage_is_recorded_for_a_complete_stream(chat_client: ChatClient) -> None:
    events = chat_client.ask("[scripted tokens=5 ttft_ms=120 itl_ms=30]")
    meta, done = events[0].json(), events[-1].json()
    record = record_of(meta["request_id"])
    assert (record.path, record.engine, record.outcome) == ("direct", "scripted", "ok")
    assert record.tokens == 5
    assert str(record.message_id) == meta["message"]
    assert 0 < record.parse_ms <= record.server_ttft_ms <= record.e2e_ms
    assert record.queue_ms is not None and record.queue_ms >= 0
    # The engine waits 120 ms; the event loop's timers may fire a little early by the clock
    # the record reads (uvloop's clock is read once per round of the loop): a bound, not a time.
    assert 115 <= record.engine_ttft_ms < 10_000
    assert record.server_ttft_ms >= record.engine_ttft_ms
    assert 25 <= record.itl_mean_ms <= record.itl_max_ms
    # The done event carries the same server timings.
    assert done["timings"]["server_ttft"] == record.server_ttft_ms
    assert done["timings"]["engine_ttft"] == record.engine_ttft_ms


def test_abort_and_error_streams_are_recorded_with_their_outcome(chat_client: ChatClient) -> None:
    response = chat_client.raw({"message": "[scripted tokens=100 itl_ms=20]"})
    events = response.events()
    request_id = next(events).json()["request_id"]
    next(events)
    response.sock.close()
    aborted = record_of(request_id)
    assert aborted.outcome == "client_abort"
    assert aborted.tokens >= 1 and aborted.server_ttft_ms is not None

    failed = chat_client.ask("[scripted tokens=5 fail_after=2]")
    record = record_of(failed[0].json()["request_id"])
    assert (record.outcome, record.error_code, record.tokens) == ("engine_error", "engine_error", 2)

    refused = chat_client.ask("[scripted fail_after=0]")
    record = record_of(refused[0].json()["request_id"])
    assert (record.outcome, record.error_code) == ("engine_error", "engine_unavailable")
    assert record.server_ttft_ms is None and record.engine_ttft_ms is None


def test_beacon_joins_the_browser_timings_to_the_record(chat_client: ChatClient) -> None:
    events = chat_client.ask("[scripted tokens=3]")
    request_id = events[0].json()["request_id"]
    report = {
        "request_id": request_id,
        "outcome": "ok",
        "ttfb_ms": 3.5,
        "ttft_ms": 61.25,
        "done_ms": 120.0,
        "waited_ms": 120.0,
        "tokens": 3,
        "itl_mean_ms": 21.0,
        "itl_max_ms": 23.5,
    }
    assert send_beacon(chat_client, report).status_code == 204
    record = StreamRecord.objects.get(request_id=request_id)
    assert (record.client_outcome, record.client_tokens) == ("ok", 3)
    assert (record.client_ttfb_ms, record.client_ttft_ms, record.client_done_ms) == (
        3.5,
        61.25,
        120,
    )
    assert record.client_itl_max_ms == 23.5 and record.client_reported_at is not None

    again = send_beacon(chat_client, report)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "beacon_duplicate"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"ttft_ms": -1}, "ttft_ms"),
        ({"ttft_ms": 1e12}, "ttft_ms"),
        ({"ttft_ms": "fast"}, "ttft_ms"),
        ({"ttft_ms": True}, "ttft_ms"),
        ({"outcome": "great"}, "outcome"),
        ({"tokens": -3}, "tokens"),
        ({"ttfb_ms": 90.0, "ttft_ms": 50.0}, "order"),
        ({"request_id": "x"}, "request_id"),
        ({"burst_gaps": 1}, "burst_gaps"),
        ({"burst_gaps": -1}, "burst_gaps"),
        ({"span_ms": -5}, "span_ms"),
    ],
)
def test_absurd_beacons_are_refused_and_nothing_is_stored(
    chat_client: ChatClient, change: dict, field: str
) -> None:
    request_id = chat_client.ask("[scripted tokens=1]")[0].json()["request_id"]
    record_of(request_id)
    report = {"request_id": request_id, "outcome": "ok", "ttft_ms": 50.0, "tokens": 1, **change}
    response = send_beacon(chat_client, report)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "beacon_invalid"
    assert StreamRecord.objects.get(request_id=request_id).client_reported_at is None


def test_beacons_for_unknown_or_other_sessions_requests_are_refused(
    chat_client: ChatClient, daphne: LiveServer
) -> None:
    request_id = chat_client.ask("[scripted tokens=1]")[0].json()["request_id"]
    record_of(request_id)
    report = {"request_id": request_id, "outcome": "ok", "ttft_ms": 50.0, "tokens": 1}
    other = ChatClient(daphne)
    try:
        response = send_beacon(other, report)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "beacon_not_yours"
    finally:
        other.close()
    unknown = send_beacon(chat_client, {**report, "request_id": "0" * 32})
    assert unknown.status_code == 404
    assert send_beacon(chat_client, report, token="x" * 32).status_code == 403
    assert StreamRecord.objects.get(request_id=request_id).client_reported_at is None


def test_beacons_are_rate_limited(daphne_factory, transactional_db) -> None:
    server = daphne_factory(CHATSITE_BEACON_RATE="2")
    client = ChatClient(server)
    # The limit counts per fixed minute, and the two beacons for an unknown request each wait
    # 3 s for its record: start early enough in a minute that all four fall in the same one.
    if time.time() % 60 > 40:
        time.sleep(60.5 - time.time() % 60)
    try:
        report = {"request_id": "f" * 32, "outcome": "stopped", "waited_ms": 10.0}
        statuses = [send_beacon(client, {**report, "outcome": "bogus"}).status_code]
        statuses += [send_beacon(client, report).status_code for _ in range(2)]
        limited = send_beacon(client, report)
    finally:
        client.close()
    # Invalid ones are refused before counting; two valid ones count; the third is limited.
    assert statuses == [400, 404, 404]
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 60


def test_abandoned_requests_count_in_the_client_ttft_histogram(
    chat_client: ChatClient, daphne: LiveServer
) -> None:
    """Stopped before its first token, a request still adds a client TTFT of the time waited."""
    before = metric_samples(daphne)
    key = (
        "ai_ttft_seconds_count",
        frozenset(
            {"path": "direct", "engine": "scripted", "source": "client", "server": "daphne"}.items()
        ),
    )
    slow_bucket = (
        "ai_ttft_seconds_bucket",
        frozenset(
            {
                "path": "direct",
                "engine": "scripted",
                "source": "client",
                "server": "daphne",
                "le": "0.5",
            }.items()
        ),
    )
    response = chat_client.raw({"message": "[scripted tokens=3 ttft_ms=3000]"})
    request_id = next(response.events()).json()["request_id"]
    time.sleep(0.8)
    response.sock.close()
    record_of(request_id)
    report = {"request_id": request_id, "outcome": "stopped", "ttfb_ms": 2.0, "waited_ms": 800.0}
    assert send_beacon(chat_client, report).status_code == 204
    after = metric_samples(daphne)
    assert after[key] == before.get(key, 0) + 1
    # 0.8 s waited: not under the 0.5 s bucket.
    assert after[slow_bucket] == before.get(slow_bucket, 0)


def test_metrics_expose_the_stream_figures(chat_client: ChatClient, daphne: LiveServer) -> None:
    chat_client.ask("[scripted tokens=4 itl_ms=5]")
    record_of(chat_client.ask("[scripted tokens=1]")[0].json()["request_id"])
    samples = metric_samples(daphne)
    names = {name for name, _ in samples}
    for name in (
        "ai_ttft_seconds_bucket",
        "ai_engine_ttft_seconds_count",
        "ai_inter_token_seconds_count",
        "ai_stream_duration_seconds_count",
        "ai_streams_total",
        "ai_tokens_total",
        "ai_streams_active",
    ):
        assert name in names, name
    server = (
        "ai_ttft_seconds_count",
        frozenset(
            {"path": "direct", "engine": "scripted", "source": "server", "server": "daphne"}.items()
        ),
    )
    assert samples[server] >= 2
    active = [v for (n, labels), v in samples.items() if n == "ai_streams_active"]
    assert active and all(v == 0 for v in active)
    assert all(not math.isnan(v) for v in samples.values())
    labels = {k for _, ls in samples for k, _ in ls}
    assert not labels & {"request_id", "session", "user", "conversation"}


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_the_stream_figures_name_the_server_that_streamed(worker_factory, server_kind: str) -> None:
    """An answer's server and browser TTFT, its gaps, duration and count, and the streams open
    while it runs, are labelled with the server its worker runs under: the pools of Daphne and
    of uvicorn share a host's /metrics, and are told apart by that label alone."""
    worker = worker_factory()
    client = ChatClient(worker)
    try:
        before = metric_samples(worker)
        # 1.5 s between tokens: the answer is still open while /metrics is read.
        stream = client.stream("[scripted tokens=3 itl_ms=1500]")
        events = [next(stream), next(stream)]  # meta, and the first token
        during = metric_samples(worker)
        events.extend(stream)
        request_id = events[0].json()["request_id"]
        assert record_of(request_id).server == server_kind
        report = {
            "request_id": request_id,
            "outcome": "ok",
            "ttfb_ms": 3.0,
            "ttft_ms": 60.0,
            "done_ms": 90.0,
            "tokens": 3,
        }
        assert send_beacon(client, report).status_code == 204
        after = metric_samples(worker)
    finally:
        client.close()

    def servers_counted(name: str, **labels: str) -> set[str | None]:
        """The ``server`` label of each ``name`` sample with ``labels`` that went up."""
        return {
            dict(key).get("server")
            for (sample, key), value in after.items()
            if sample == name
            and labels.items() <= dict(key).items()
            and value > before.get((sample, key), 0)
        }

    direct = {"path": "direct", "engine": "scripted"}
    open_now = {
        dict(key).get("server"): value
        for (sample, key), value in during.items()
        if sample == "ai_streams_active" and direct.items() <= dict(key).items() and value
    }
    assert open_now == {server_kind: 1}
    assert servers_counted("ai_ttft_seconds_count", **direct, source="server") == {server_kind}
    assert servers_counted("ai_ttft_seconds_count", **direct, source="client") == {server_kind}
    assert servers_counted("ai_inter_token_seconds_count", **direct) == {server_kind}
    assert servers_counted("ai_streams_total", **direct, outcome="ok") == {server_kind}
    assert servers_counted("ai_stream_duration_seconds_count", **direct, outcome="ok") == {
        server_kind
    }


@pytest.mark.parametrize(
    ("span_ms", "burst_gaps", "buffered"),
    [
        (100.0, 0, False),  # arrived as spread out as it was sent
        (2.0, 5, True),  # all at once at the end: a buffering proxy
        (90.0, 4, True),  # spread over time, but in clumps
    ],
)
def test_the_beacon_flags_tokens_that_arrived_in_bursts(
    chat_client: ChatClient, span_ms: float, burst_gaps: int, buffered: bool
) -> None:
    """The server sent 6 tokens 20 ms apart; the browser says how they arrived."""
    request_id = chat_client.ask("[scripted tokens=6 itl_ms=20]")[0].json()["request_id"]
    record = record_of(request_id)
    assert record.server_span_ms >= 90 and record.server_burst_gaps == 0
    report = {
        "request_id": request_id,
        "outcome": "ok",
        "ttft_ms": 60.0,
        "tokens": 6,
        "span_ms": span_ms,
        "burst_gaps": burst_gaps,
    }
    assert send_beacon(chat_client, report).status_code == 204
    record.refresh_from_db()
    assert (record.client_span_ms, record.client_burst_gaps) == (span_ms, burst_gaps)
    assert record.buffered is buffered


def test_a_short_stream_cannot_be_judged(chat_client: ChatClient) -> None:
    request_id = chat_client.ask("[scripted tokens=2 itl_ms=20]")[0].json()["request_id"]
    record_of(request_id)
    report = {"request_id": request_id, "outcome": "ok", "ttft_ms": 60.0, "tokens": 2}
    assert send_beacon(chat_client, {**report, "span_ms": 0.5, "burst_gaps": 1}).status_code == 204
    assert StreamRecord.objects.get(request_id=request_id).buffered is None
