"""Limits and timeouts, over real HTTP on both serving paths: every refusal is quick, clear and
says when to try again, and an engine that goes silent ends its stream with an error."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from assistant.models import Message, StreamRecord
from tests.support import ChatClient, LiveServer, RawResponse, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["direct", "django"])
def url(request: pytest.FixtureRequest) -> str:
    return f"/api/chat/stream/{request.param}"


@pytest.fixture(scope="module")
def strict(daphne_factory) -> LiveServer:
    """Three questions a minute, silence limits of 0.4 s, at most two streams on the engine."""
    return daphne_factory(
        CHATSITE_CHAT_RATE="3",
        CHATSITE_FIRST_TOKEN_TIMEOUT="0.4",
        CHATSITE_TOKEN_TIMEOUT="0.4",
        CHATSITE_MAX_STREAMS="2",
    )


def refusal(response) -> tuple[int, str, str | None]:
    payload = json.loads(response.body())
    return response.status, payload["error"]["code"], response.header("retry-after")


def test_a_silent_engine_ends_the_stream_with_a_timeout(
    strict: LiveServer, transactional_db, url: str
) -> None:
    client = ChatClient(strict)
    try:
        started = time.monotonic()
        events = client.ask(f"[scripted hang=1 tag=hang-{url[-6:]}] Hello?", url=url)
        waited = time.monotonic() - started
    finally:
        client.close()
    assert [e.event for e in events] == ["meta", "error"]
    assert events[1].json()["code"] == "first_token_timeout"
    assert "took too long" in events[1].json()["message"]
    assert 0.4 <= waited < 2
    strict.wait_engine_event(f"hang-{url[-6:]}", "cancel")
    record = wait_for(
        lambda: StreamRecord.objects.filter(request_id=events[0].json()["request_id"]).first()
    )
    assert (record.outcome, record.error_code) == ("timeout", "first_token_timeout")


def test_silence_mid_answer_keeps_what_was_said(
    strict: LiveServer, transactional_db, url: str
) -> None:
    client = ChatClient(strict)
    try:
        events = client.ask("[scripted tokens=3 itl_ms=0 fail_after=99] x", url=url)
        assert events[-1].event == "done"  # quick tokens: no timeout
        events = client.ask("[scripted tokens=4 ttft_ms=0 itl_ms=900] Slow down", url=url)
    finally:
        client.close()
    assert [e.event for e in events] == ["meta", "token", "error"]
    assert events[-1].json()["code"] == "token_timeout"
    answer = wait_for(lambda: Message.objects.filter(id=events[0].json()["message"]).first())
    assert answer.status == "partial" and answer.content == events[1].json()["text"]


def test_too_many_questions_a_minute_get_429_with_retry_after(
    strict: LiveServer, transactional_db, url: str
) -> None:
    client = ChatClient(strict)
    try:
        for _ in range(3):
            assert client.ask("[scripted tokens=1 ttft_ms=0]", url=url)[-1].event == "done"
        status, code, retry_after = refusal(client.raw({"message": "one more"}, path=url))
    finally:
        client.close()
    assert (status, code) == (429, "rate_limited")
    assert 1 <= int(retry_after) <= 60


def test_one_answer_at_a_time_per_session(daphne: LiveServer, transactional_db, url: str) -> None:
    client = ChatClient(daphne)
    try:
        streaming = client.raw({"message": "[scripted tokens=40 itl_ms=50]"}, path=url)
        next(streaming.events())  # meta: the first answer is under way
        status, code, retry_after = refusal(client.raw({"message": "again"}, path=url))
        assert (status, code, retry_after) == (429, "stream_active", "5")
        streaming.sock.close()  # the student stops the first answer: the slot frees at once
        events = wait_for(lambda: _answered(client, url), timeout=3)
    finally:
        client.close()
    assert events[-1].event == "done"


@pytest.fixture(scope="module")
def resuming(daphne_factory) -> LiveServer:
    """Answers whose page went away wait 30 s for a resume, as by default."""
    return daphne_factory(CHATSITE_RESUME_GRACE_S="30")


def test_questions_sent_at_once_by_one_session_get_one_answer(
    resuming: LiveServer, transactional_db, url: str
) -> None:
    """Several questions of one session in flight together: one answer streams to its end, and
    every other request is refused 429 ``stream_active`` (none starts and is then cut off)."""
    client = ChatClient(resuming)
    try:
        # Each answer takes 3 s, longer than a refused request waits for a slot (1 s).
        socks = [
            client.send({"message": f"[scripted tokens=60 itl_ms=50] question {n}"}, path=url)
            for n in range(5)
        ]
        responses = [RawResponse(sock) for sock in socks]
        outcomes = []
        for response in responses:
            if response.status == 200:
                outcomes.append((200, [event.event for event in response.events()][-1]))
            else:
                outcomes.append(refusal(response)[:2])
    finally:
        client.close()
    assert sorted(outcomes) == [(200, "done")] + [(429, "stream_active")] * 4


def _answered(client: ChatClient, url: str) -> list | None:
    response = client.raw({"message": "[scripted tokens=1 ttft_ms=0] now?"}, path=url)
    return list(response.events()) if response.status == 200 else None


def test_a_full_engine_answers_503_at_once(strict: LiveServer, transactional_db, url: str) -> None:
    students = [ChatClient(strict) for _ in range(3)]
    try:
        open_streams = [
            s.raw({"message": "[scripted tokens=20 itl_ms=100]"}, path=url) for s in students[:2]
        ]
        for response in open_streams:
            next(response.events())
        started = time.monotonic()
        response = students[2].raw({"message": "me too"}, path=url)
        status, code, retry_after = refusal(response)
        assert time.monotonic() - started < 0.5
    finally:
        for student in students:
            student.close()
    assert (status, code, retry_after) == (503, "engine_busy", "2")
    # Refused streams are recorded as failures (the breaker and the dashboard count them).
    wait_for(lambda: StreamRecord.objects.filter(error_code="engine_busy").exists())


def test_the_engine_takes_streams_again_once_they_end(strict: LiveServer, transactional_db) -> None:
    with ThreadPoolExecutor(4) as pool:
        students = [ChatClient(strict) for _ in range(4)]
        try:
            runs = [pool.submit(s.ask, "[scripted tokens=2 ttft_ms=0]") for s in students[:2]]
            assert all(r.result()[-1].event == "done" for r in runs)
            runs = [pool.submit(s.ask, "[scripted tokens=2 ttft_ms=0]") for s in students[2:]]
            assert all(r.result()[-1].event == "done" for r in runs)
        finally:
            for student in students:
                student.close()


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_a_client_that_stops_reading_is_dropped_and_others_are_not_held_up(
    worker_factory, transactional_db, url: str, server_kind: str
) -> None:
    """A reader with a tiny window that reads nothing: once 64 KiB wait unread the stream ends
    (engine cancelled, outcome slow_client); a student streaming meanwhile is unaffected."""
    server: LiveServer = worker_factory(CHATSITE_MAX_UNSENT_BYTES="65536")
    # 800 KB of answer, sent as fast as the engine can.
    _stalled_reader_dropped(server, url, tokens=400, size=2000)


def test_under_uvicorn_the_limit_is_met_before_its_send_waits(
    uvicorn_factory, transactional_db
) -> None:
    """uvicorn's ``send`` waits once its transport holds 64 KiB (its flow control): with a limit
    above what the kernel's send buffer can hold, a stalled reader's answer would wait there
    for good, below the limit. chatsite raises the transport's mark above the limit, so the
    reader is dropped as under Daphne."""
    kernel_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    # At most 16 MiB (an answer three times that): on a host whose kernel may hold more, the
    # check meets the reader before uvicorn's send waits either way.
    limit = min(2 * kernel_max, 16 * 1024 * 1024)
    server: LiveServer = uvicorn_factory(CHATSITE_MAX_UNSENT_BYTES=str(limit))
    size = 65536
    _stalled_reader_dropped(server, "/api/chat/stream/direct", tokens=3 * limit // size, size=size)


def _stalled_reader_dropped(server: LiveServer, url: str, *, tokens: int, size: int) -> None:
    import socket

    stalled, other = ChatClient(server), ChatClient(server)
    tag = f"stalled-{url[-6:]}-{tokens}"
    body = json.dumps(
        {"message": f"[scripted tokens={tokens} size={size} ttft_ms=0 itl_ms=0 tag={tag}]"}
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    cookies = "; ".join(f"{k}={v}" for k, v in stalled.cookies().items())
    head = (
        f"POST {url} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"X-CSRFToken: {stalled.csrf_token}\r\nCookie: {cookies}\r\n\r\n"
    )
    try:
        sock.sendall(head.encode() + body.encode())
        cancel = server.wait_engine_event(tag, "cancel", timeout=10)
        assert cancel["tokens"] < tokens
        events = other.ask("[scripted tokens=5 ttft_ms=0 itl_ms=0] still there?", url=url)
        assert events[-1].event == "done"
        record = wait_for(lambda: StreamRecord.objects.filter(outcome="slow_client").first())
        assert record.path == url.rsplit("/", 1)[1]
    finally:
        sock.close()
        stalled.close()
        other.close()
