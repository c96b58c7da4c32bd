"""nginx's own per-address limits (deploy/nginx/snippets/chatsite-http.conf), with the real nginx
in front of a real Daphne: each client on its own loopback address, as nginx keys on it.

The request limits are tested at their shipped values; the open-streams limit (120) with the
number lowered to 3, so the test holds 4 streams rather than 121.
"""

import json
import time
from collections.abc import Iterator

import pytest

from tests.support import (
    ChatClient,
    Event,
    LiveServer,
    NginxServer,
    RawResponse,
    raw_post,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

SITE = "chatsite.conf"
LIMITS = "snippets/chatsite-stream-limits.conf"
PAGE_BURST, PAGE_RATE = 240, 5
STREAM_BURST, STREAM_RATE = 120, 4
OPEN_STREAMS = 3


@pytest.fixture(scope="module")
def site(nginx_factory, daphne: LiveServer) -> NginxServer:
    return nginx_factory(SITE, [daphne.port])


@pytest.fixture(scope="module")
def few_streams(nginx_factory, daphne: LiveServer) -> NginxServer:
    edit = (
        LIMITS,
        "limit_conn chatsite_streams_open 120;",
        f"limit_conn chatsite_streams_open {OPEN_STREAMS};",
    )
    return nginx_factory(SITE, [daphne.port], edits=[edit])


def statuses(responses: Iterator[RawResponse]) -> list[tuple[int, str | None, str | None]]:
    """Each response's status, nginx's error code if it refused, and its Retry-After."""
    seen = []
    for response in responses:
        try:
            body = response.body()
            code = None
            if response.status == 429:
                code = json.loads(body)["error"]["code"]
            seen.append((response.status, code, response.header("retry-after")))
        finally:
            response.sock.close()
    return seen


def burst_allowed(
    seen: list[tuple[int, str | None, str | None]], burst: int, rate: float, took: float
) -> None:
    """The first ``burst`` + 1 went through; beyond them only what the rate refilled meanwhile;
    every refusal is nginx's JSON 429 with Retry-After."""
    passed = [s for s in seen if s[0] != 429]
    refused = [s for s in seen if s[0] == 429]
    assert all(s[0] != 429 for s in seen[: burst + 1])
    assert burst + 1 <= len(passed) <= burst + 1 + rate * took + 1
    assert refused and all(code == "proxy_limited" and retry == "2" for _, code, retry in refused)


def test_page_requests_per_address_are_limited_beyond_their_burst(site: NginxServer) -> None:
    source = "127.0.0.200"
    sent = PAGE_BURST + 30
    started = time.monotonic()
    responses = (
        raw_post(site.port, b"", method="GET", path="/api/conversations", source=source)
        for _ in range(sent)
    )
    seen = statuses(responses)
    burst_allowed(seen, PAGE_BURST, PAGE_RATE, time.monotonic() - started)
    # Another address has its own allowance.
    assert (
        statuses(iter([raw_post(site.port, b"", method="GET", path="/", source="127.0.0.201")]))[0][
            0
        ]
        == 200
    )


def test_questions_per_address_are_limited_beyond_their_burst(site: NginxServer) -> None:
    source = "127.0.0.202"
    headers = {"Content-Type": "application/json"}
    sent = STREAM_BURST + 30
    started = time.monotonic()
    responses = (raw_post(site.port, b"{}", headers=headers, source=source) for _ in range(sent))
    seen = statuses(responses)
    # What got through reached the app, which refused it itself (no CSRF token).
    assert {s[0] for s in seen if s[0] != 429} == {403}
    burst_allowed(seen, STREAM_BURST, STREAM_RATE, time.monotonic() - started)


def test_open_streams_per_address_are_limited(few_streams: NginxServer) -> None:
    source = "127.0.0.203"
    student = ChatClient(few_streams, source=source)
    try:
        held = []
        for _ in range(OPEN_STREAMS):
            # One session per stream, as a flood would have (a session streams one at a time).
            other = ChatClient(few_streams, source=source)
            response = other.raw({"message": "[scripted hang=1] wait", "conversation": None})
            assert response.status == 200
            held.append((other, response))
        refused = student.raw({"message": "[scripted tokens=1] me?", "conversation": None})
        assert statuses(iter([refused])) == [(429, "proxy_limited", "2")]
        # Another address is not held up, and a stream that ends frees its connection.
        elsewhere = ChatClient(few_streams, source="127.0.0.204")
        try:
            assert elsewhere.ask("[scripted tokens=1 ttft_ms=0] hi")[-1].event == "done"
        finally:
            elsewhere.close()
        other, response = held.pop()
        response.sock.close()
        other.close()
        assert wait_for(lambda: _answered(student), timeout=5)[-1].event == "done"
    finally:
        for other, response in held:
            response.sock.close()
            other.close()
        student.close()


def _answered(student: ChatClient) -> list[Event] | None:
    response = student.raw({"message": "[scripted tokens=1 ttft_ms=0] now?", "conversation": None})
    try:
        return list(response.events()) if response.status == 200 else None
    finally:
        response.sock.close()
