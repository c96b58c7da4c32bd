"""Slow and oversized requests, against a real Daphne (``python -m chatsite.server``) on raw
sockets: a body trickled a byte at a time is answered 408 and its connection closed, on every
path, and under uvicorn (``python -m chatsite.uvicorn_server``) too; a stream body over the
limit is refused with 413 on both serving paths, by the router, before Django's handler reads
it."""

import json
import socket
import threading
import time

import pytest

from tests.assistant.faults_support import metric
from tests.support import ChatClient, LiveServer, RawResponse, raw_post

pytestmark = pytest.mark.django_db(transaction=True)

STREAM_URLS = ("/api/chat/stream/direct", "/api/chat/stream/django")
#: The slow server's deadline for a whole request, in seconds.
REQUEST_TIMEOUT_S = 2


@pytest.fixture(scope="module", params=["daphne", "uvicorn"])
def slow_guarded(request: pytest.FixtureRequest) -> LiveServer:
    factory = request.getfixturevalue(f"{request.param}_factory")
    return factory(CHATSITE_REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S))


def trickle(server: LiveServer, client: ChatClient, path: str) -> tuple[RawResponse, int, float]:
    """POST a 400-byte body one byte every 0.25 s (100 s in all, were it let through); the
    response, how many bytes of the body were sent, and the seconds until the response."""
    body = json.dumps({"message": "x" * 380}).encode()
    cookies = "; ".join(f"{k}={v}" for k, v in client.cookies().items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Content-Type: application/json\r\nX-CSRFToken: {client.csrf_token}\r\n"
        f"Cookie: {cookies}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(head.encode("latin-1"))
    sent = 0
    stop = threading.Event()

    def drip() -> None:
        nonlocal sent
        for byte in body:
            if stop.wait(0.25):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return
            sent += 1

    dripping = threading.Thread(target=drip, daemon=True)
    started = time.monotonic()
    dripping.start()
    try:
        response = RawResponse(sock)
        waited = time.monotonic() - started
    finally:
        stop.set()
        dripping.join()
    return response, sent, waited


@pytest.mark.parametrize("path", [*STREAM_URLS, "/api/session"])
def test_a_trickled_body_gets_408_and_its_connection_closed(
    slow_guarded: LiveServer, path: str
) -> None:
    client = ChatClient(slow_guarded)
    try:
        response, sent, waited = trickle(slow_guarded, client, path)
        try:
            assert response.status == 408
            assert response.header("connection") == "close"
            assert response.header("content-security-policy")
            payload = json.loads(response.body())
            assert payload["error"]["code"] == "request_timeout"
            assert response.sock.recv(1) == b""  # closed by the server
        finally:
            response.sock.close()
    finally:
        client.close()
    assert sent < 390  # refused long before the body could have been whole
    assert REQUEST_TIMEOUT_S <= waited < 30  # the deadline, plus the server's check, loosely


def test_a_request_that_arrives_in_time_is_served(slow_guarded: LiveServer) -> None:
    client = ChatClient(slow_guarded)
    try:
        events = client.ask("[scripted tokens=2 ttft_ms=0] quick")
    finally:
        client.close()
    assert events[-1].event == "done"


def test_a_request_pipelined_behind_an_answer_waits_for_it(uvicorn_factory) -> None:
    """Under uvicorn, a second request sent on the same connection while the first is being
    answered is not read on (the server pauses reading), so it is no trickle: the answer goes
    out whole, and only then is the unfinished second request refused 408."""
    server = uvicorn_factory(CHATSITE_REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S))
    client = ChatClient(server)
    try:
        cookies = "; ".join(f"{k}={v}" for k, v in client.cookies().items())
        head = (
            f"Host: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            f"X-CSRFToken: {client.csrf_token}\r\nCookie: {cookies}\r\n"
        )
        first = json.dumps({"message": "[scripted tokens=20 itl_ms=200] a long answer"})
        pipelined = (
            f"POST /api/chat/stream HTTP/1.1\r\n{head}Content-Length: {len(first)}\r\n\r\n{first}"
            f"POST /api/session HTTP/1.1\r\n{head}Content-Length: 100\r\n\r\n{{"
        )
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        sock.sendall(pipelined.encode("latin-1"))
        received = b""
        while chunk := sock.recv(65536):  # the server closes after its 408
            received += chunk
        sock.close()
    finally:
        client.close()
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    done = received.find(b"event: done")
    refused = received.find(b"HTTP/1.1 408")
    assert 0 < done < refused, received[-400:]
    assert received.count(b"event: token") == 20


@pytest.mark.parametrize("url", STREAM_URLS)
def test_an_oversized_stream_body_is_refused_before_django_reads_it(
    daphne: LiveServer, url: str
) -> None:
    client = ChatClient(daphne)
    handled = metric(daphne, "django_http_responses_total_by_status_total", status="413")
    refused = metric(daphne, "ai_rejections_total", reason="body_too_large")
    try:
        body = json.dumps({"message": "x" * 3_000_000}).encode()
        declared = client.raw(body, path=url)
        # Chunked: no Content-Length to go by, refused as it is read.
        chunked = raw_post(
            daphne.port,
            b"",
            cookies=client.cookies(),
            headers={"Content-Type": "application/json", "X-CSRFToken": client.csrf_token},
            path=url,
            chunked_body=body,
        )
        outcomes = []
        for response in (declared, chunked):
            outcomes.append((response.status, json.loads(response.body())["error"]["code"]))
            response.sock.close()
    finally:
        client.close()
    assert outcomes == [(413, "body_too_large")] * 2
    assert metric(daphne, "ai_rejections_total", reason="body_too_large") == refused + 2
    # Not one of them reached a Django view (which would have read all 3 MB first).
    assert metric(daphne, "django_http_responses_total_by_status_total", status="413") == handled
