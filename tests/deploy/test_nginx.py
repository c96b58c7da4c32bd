"""deploy/nginx, served by the real nginx in front of real Daphne workers.

Each site is rendered mechanically from the shipped files: the example workers, listen port,
static root and access log are replaced by this run's, and nothing else changes unless a test
says which directive it breaks on purpose.
"""

import gzip
import itertools
import json
import re
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from assistant.benchmarking.ports import free_port
from assistant.services.api_keys import key_create
from deploy.loopback_stack import NGINX_DIR, STATIC_DIR, Edit, nginx_args, render
from tests.support import (
    ChatClient,
    Event,
    LiveServer,
    NginxServer,
    RawResponse,
    ThreadedCountingProxy,
    raw_post,
    raw_post_send,
    wait_for,
)
from tests.support import page_visit as support_page_visit

# The Daphne workers share the test database; each test leaves it empty.
pytestmark = pytest.mark.django_db(transaction=True)

SITE = "chatsite.conf"
SPLIT_SITE = "chatsite-split.conf"
SERVERS_SITE = "chatsite-servers.conf"
SSE_SNIPPET = "snippets/chatsite-sse.conf"
SERVER_SNIPPET = "snippets/chatsite-server.conf"
PROXY_SNIPPET = "snippets/chatsite-proxy.conf"

Cookies = dict[str, str]
BUFFERED = (
    SSE_SNIPPET,
    "proxy_buffering off;",
    "proxy_buffering on;\nproxy_ignore_headers X-Accel-Buffering;",
)
BUFFERING_ON = (SSE_SNIPPET, "proxy_buffering off;", "proxy_buffering on;")
HTTP_10 = (PROXY_SNIPPET, "proxy_http_version 1.1;", "proxy_http_version 1.0;")
STREAM_GZIPPED = [
    (SSE_SNIPPET, "gzip off;", "gzip on;"),
    (SERVER_SNIPPET, "gzip_types ", "gzip_types text/event-stream "),
]


@pytest.fixture(scope="module")
def workers(daphne: LiveServer, daphne_factory: Callable[..., LiveServer]) -> list[LiveServer]:
    """Two Daphne workers with the scripted engine, as the upstream's two servers."""
    return [daphne, daphne_factory()]


@pytest.fixture(scope="module")
def site(nginx_factory, workers: list[LiveServer]) -> NginxServer:
    return nginx_factory(SITE, [w.port for w in workers])


@pytest.fixture(scope="module")
def visitor(daphne: LiveServer) -> Cookies:
    """A session and CSRF token, as the page hands them out (valid on every worker)."""
    client = ChatClient(daphne)
    try:
        return client.cookies()
    finally:
        client.close()


@pytest.fixture(scope="module")
def figures(output_dir: Path) -> Iterator[dict[str, Any]]:
    """Measurements, written to test-output/nginx.json after the module."""
    found: dict[str, Any] = {}
    yield found
    (output_dir / "nginx.json").write_text(json.dumps(found, indent=2) + "\n")


def page_visit(port: int, source: str | None = None) -> Cookies:
    """The cookies a first visit to the page sets (from the loopback address ``source``): a new
    session and a CSRF token."""
    visit = support_page_visit(port, source)
    assert visit.status == 200
    return visit.cookies


def post_chat(
    port: int,
    cookies: Cookies,
    message: str,
    *,
    path: str = "/api/chat/stream",
    headers: dict[str, str] | None = None,
    source: str | None = None,
) -> RawResponse:
    body = json.dumps({"message": message, "conversation": None}).encode()
    all_headers = {
        "Content-Type": "application/json",
        "X-CSRFToken": cookies["csrftoken"],
        **(headers or {}),
    }
    return raw_post(port, body, cookies=cookies, headers=all_headers, path=path, source=source)


def answer(port: int, cookies: Cookies, message: str, **kwargs: Any) -> tuple[float, list[Event]]:
    """When the request was sent, and every event of its answer stamped with its arrival."""
    sent = time.monotonic()
    response = post_chat(port, cookies, message, **kwargs)
    try:
        assert response.status == 200, (response.status, response.body())
        return sent, list(response.events())
    finally:
        response.sock.close()


def tokens_of(events: list[Event]) -> list[Event]:
    return [e for e in events if e.event == "token"]


def meta_of(events: list[Event]) -> dict[str, Any]:
    assert events[0].event == "meta", events
    return events[0].json()


def first_token_ms(port: int, cookies: Cookies, message: str) -> float:
    sent, events = answer(port, cookies, message)
    assert events[-1].event == "done", events
    return (tokens_of(events)[0].at - sent) * 1000


def arrival_gaps_ms(port: int, cookies: Cookies, message: str) -> tuple[float, list[float]]:
    """Time to the first token and the gaps between token arrivals, in milliseconds."""
    sent, events = answer(port, cookies, message)
    stamps = [e.at for e in tokens_of(events)]
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    return (stamps[0] - sent) * 1000, gaps


def logged(server: NginxServer, needle: str) -> str:
    """The access log line containing ``needle`` (nginx writes it when the response ends)."""
    return wait_for(lambda: next((line for line in server.access_lines() if needle in line), ""))


# --- the configuration itself ---------------------------------------------------------------


@pytest.mark.parametrize("site_file", [SITE, SPLIT_SITE, SERVERS_SITE])
def test_nginx_accepts_shipped_configs(nginx_binary: str, tmp_path: Path, site_file: str) -> None:
    """`nginx -t` passes on each shipped site with its snippets, without a single warning."""
    ports = [free_port(), free_port()]
    uvicorn_workers = [free_port(), free_port()] if site_file == SERVERS_SITE else []
    main = render(
        tmp_path, site_file, workers=ports, port=free_port(), uvicorn_workers=uvicorn_workers
    )
    result = subprocess.run(
        [*nginx_args(nginx_binary, main), "-t"], capture_output=True, text=True, timeout=30
    )
    output = result.stdout + result.stderr + (tmp_path / "error.log").read_text()
    assert result.returncode == 0, output
    assert "test is successful" in output
    assert "[warn]" not in output and "[emerg]" not in output, output


def test_sse_directives_live_in_one_snippet() -> None:
    """Every event-stream location (the API's too) includes the one SSE snippet and repeats none
    of it; each of them sets its own body size, which the snippet leaves to it."""
    sse = (NGINX_DIR / SSE_SNIPPET).read_text()
    for directive in ("proxy_buffering off;", "gzip off;", "proxy_read_timeout"):
        assert directive in sse
    assert "client_max_body_size" not in re.sub(r"#.*", "", sse)
    for path in [*NGINX_DIR.glob("*.conf"), *(NGINX_DIR / "snippets").glob("*.conf")]:
        text = re.sub(r"#.*", "", path.read_text())
        if path.name != "chatsite-sse.conf":
            assert "proxy_buffering" not in text and "proxy_read_timeout" not in text, path
        assert "text/event-stream" not in text, f"{path.name} lists text/event-stream"
        for location in re.findall(r"location\s+([^{]+)\{([^}]*)\}", text):
            route, body = location
            proxied_name = "@" in route and "proxy_pass" in body
            streams = ("/api/chat/stream", "/dashboard/events", "/v1/")
            if any(stream in route for stream in streams) or proxied_name:
                assert "include snippets/chatsite-sse.conf;" in body, (path.name, route)
            if "include snippets/chatsite-sse.conf;" in body:
                sized = "include snippets/chatsite-chat-body.conf;" in body
                assert sized or "client_max_body_size" in body, (path.name, route)


# --- streaming through nginx ----------------------------------------------------------------


def test_first_token_as_fast_as_direct(
    site: NginxServer, daphne: LiveServer, visitor: Cookies, figures: dict[str, Any]
) -> None:
    """Through nginx the first token arrives within 5 ms of the direct path's (medians of 21
    requests each, interleaved, measured by the client from sending to the first token)."""
    message = "[scripted tokens=3 ttft_ms=50 itl_ms=5] What is photosynthesis?"
    first_token_ms(site.port, visitor, message)  # opens nginx's keepalive connections
    direct, proxied = [], []
    for _ in range(21):
        direct.append(first_token_ms(daphne.port, visitor, message))
        proxied.append(first_token_ms(site.port, visitor, message))
    figures["ttft_ms_median"] = {
        "direct": round(statistics.median(direct), 2),
        "nginx": round(statistics.median(proxied), 2),
    }
    assert statistics.median(proxied) - statistics.median(direct) < 5, figures


def test_worker_connections_are_reused(nginx_factory, daphne: LiveServer, visitor: Cookies) -> None:
    """Ten answers in a row through nginx open one connection to the worker (upstream
    keepalive), not one each."""
    with ThreadedCountingProxy(daphne.port) as relay:
        site = nginx_factory(SITE, [relay.port, relay.port])
        for _ in range(10):
            answer(site.port, visitor, "[scripted tokens=1 ttft_ms=0] Again?")
        assert relay.accepted == 1


def test_tokens_arrive_as_the_server_sends_them(
    site: NginxServer, daphne: LiveServer, visitor: Cookies, figures: dict[str, Any]
) -> None:
    """Ten tokens 50 ms apart arrive 50 ms apart through nginx, as they do directly."""
    message = "[scripted tokens=10 ttft_ms=20 itl_ms=50] Spread out"
    _, direct = arrival_gaps_ms(daphne.port, visitor, message)
    _, proxied = arrival_gaps_ms(site.port, visitor, message)
    figures["gap_ms_median"] = {
        "direct": round(statistics.median(direct), 2),
        "nginx": round(statistics.median(proxied), 2),
    }
    assert len(proxied) == 9
    assert min(proxied) > 25, proxied
    assert abs(statistics.median(proxied) - statistics.median(direct)) < 10, (direct, proxied)


@pytest.mark.parametrize(
    ("edits", "burst"),
    [
        pytest.param([BUFFERED, HTTP_10], True, id="buffered-http1.0"),
        pytest.param([BUFFERED], False, id="buffered-http1.1"),
        pytest.param([BUFFERING_ON, HTTP_10], False, id="app-header-honoured-http1.0"),
    ],
)
def test_what_holds_the_stream_back(
    nginx_factory,
    workers: list[LiveServer],
    visitor: Cookies,
    figures: dict[str, Any],
    edits: list[Edit],
    burst: bool,
    request: pytest.FixtureRequest,
) -> None:
    """Ten tokens 50 ms apart arrive in one burst at the end only when nginx buffers the response
    (proxy_buffering on, the app's X-Accel-Buffering ignored) and also cannot see where the app's
    writes end (an HTTP/1.0 upstream connection, nginx's default: no chunks). Over HTTP/1.1 nginx
    passes each complete chunk on even while buffering, and the app's header alone turns
    buffering off."""
    variant = nginx_factory(SITE, [w.port for w in workers], edits=edits)
    ttft, gaps = arrival_gaps_ms(
        variant.port, visitor, "[scripted tokens=10 ttft_ms=20 itl_ms=50] Hi"
    )
    figures.setdefault("variants", {})[request.node.callspec.id] = {
        "ttft_ms": round(ttft, 2),
        "span_ms": round(sum(gaps), 2),
    }
    if burst:
        assert ttft > 400 and sum(gaps) < 20, (ttft, gaps)
    else:
        assert ttft < 200 and min(gaps) > 25, (ttft, gaps)


def test_leaving_mid_answer_stops_the_engine(
    site: NginxServer, workers: list[LiveServer], visitor: Cookies
) -> None:
    """A student who leaves mid-answer through nginx stops the engine within a second: nginx
    closes the worker's connection when the browser's closes."""
    tag = f"leave-{uuid.uuid4().hex[:8]}"
    response = post_chat(site.port, visitor, f"[scripted tokens=500 itl_ms=20 tag={tag}] Long")
    assert next(e for e in response.events() if e.event == "token")
    left = time.monotonic()
    response.sock.close()

    def cancelled() -> dict[str, Any] | None:
        rows = [row for worker in workers for row in worker.engine_events(tag)]
        return next((row for row in rows if row["event"] == "cancel"), None)

    assert wait_for(cancelled)["t"] - left < 1.0


def test_event_stream_is_never_compressed(site: NginxServer, visitor: Cookies) -> None:
    """A client that accepts gzip gets the event stream uncompressed, tokens intact."""
    response = post_chat(
        site.port,
        visitor,
        "[scripted tokens=5 ttft_ms=0 itl_ms=0] Zip?",
        headers={"Accept-Encoding": "gzip, deflate, br"},
    )
    try:
        assert response.status == 200
        assert response.header("content-type") == "text/event-stream; charset=utf-8"
        assert response.header("content-encoding") is None
        assert response.header("x-accel-buffering") is None
        assert len(tokens_of(list(response.events()))) == 5
    finally:
        response.sock.close()


def test_gzip_would_compress_the_stream_despite_proxy_buffering_off(
    nginx_factory, workers: list[LiveServer], visitor: Cookies
) -> None:
    """proxy_buffering off and the app's Cache-Control: no-transform do not stop nginx's gzip:
    without `gzip off` and with the type listed, the stream comes compressed."""
    zipped = nginx_factory(SITE, [w.port for w in workers], edits=STREAM_GZIPPED)
    response = post_chat(
        zipped.port,
        visitor,
        "[scripted tokens=5 ttft_ms=0 itl_ms=0] Zip?",
        headers={"Accept-Encoding": "gzip"},
    )
    try:
        assert response.header("content-encoding") == "gzip"
        assert b"event: done" in gzip.decompress(response.body())
    finally:
        response.sock.close()


def test_static_files_served_by_nginx(site: NginxServer) -> None:
    """Static files come from disk with their types (JavaScript for .mjs too, the web app
    manifest's own), a short cache lifetime,
    nosniff once, and gzip for a client that accepts it."""
    types = {
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".css": "text/css",
        ".webmanifest": "application/manifest+json",
        ".svg": "image/svg+xml",
        ".png": "image/png",
    }
    for path in sorted(STATIC_DIR.rglob("*")):
        if path.suffix not in types:
            continue
        url = "/static/" + path.relative_to(STATIC_DIR).as_posix()
        response = raw_post(site.port, b"", method="GET", path=url)
        try:
            assert response.status == 200, url
            assert response.header("content-type") == types[path.suffix], url
            assert response.header("cache-control") == "max-age=300", url
            assert response.header_count("x-content-type-options") == 1, url
            # The app's middleware would have added its own headers; nginx answered alone.
            assert response.header("referrer-policy") is None, url
            assert response.body() == path.read_bytes(), url
        finally:
            response.sock.close()
    big = STATIC_DIR / "vendor" / "marked" / "marked.esm.js"
    response = raw_post(
        site.port,
        b"",
        method="GET",
        path="/static/vendor/marked/marked.esm.js",
        headers={"Accept-Encoding": "gzip"},
    )
    try:
        assert response.header("content-encoding") == "gzip"
        assert response.header("vary") == "Accept-Encoding"
        assert gzip.decompress(response.body()) == big.read_bytes()
    finally:
        response.sock.close()


def test_app_security_headers_are_not_doubled(site: NginxServer) -> None:
    """The page through nginx carries each security header the app sends exactly once, and
    nginx does not announce its version."""
    response = raw_post(site.port, b"", method="GET", path="/")
    try:
        assert response.status == 200
        for name in (
            "x-content-type-options",
            "x-frame-options",
            "referrer-policy",
            "content-security-policy",
            "cross-origin-opener-policy",
        ):
            assert response.header_count(name) == 1, name
        assert response.header("server") == "nginx"
        assert response.header_count("strict-transport-security") == 0
    finally:
        response.sock.close()


def test_request_id_joins_page_nginx_and_app(site: NginxServer, visitor: Cookies) -> None:
    """The page's own X-Request-Id reaches the app; without one, the app uses nginx's
    $request_id, the one in nginx's access log."""
    message = "[scripted tokens=1 ttft_ms=0] Which id?"
    _, events = answer(site.port, visitor, message, headers={"X-Request-Id": "page-made-id-0001"})
    assert meta_of(events)["request_id"] == "page-made-id-0001"
    assert logged(site, "rid=page-made-id-0001 ")
    _, events = answer(site.port, visitor, message)
    request_id = meta_of(events)["request_id"]
    line = logged(site, f"rid={request_id} ")
    assert '"POST /api/chat/stream HTTP/1.1" 200' in line


def test_browser_origin_passes_csrf_through_nginx(site: NginxServer, visitor: Cookies) -> None:
    """A same-origin POST from the page (Origin with nginx's port) passes the app's CSRF check:
    nginx hands on the Host header with its port."""
    _, events = answer(
        site.port,
        visitor,
        "[scripted tokens=1 ttft_ms=0] Origin?",
        headers={"Origin": site.url},
    )
    assert events[-1].event == "done"


def test_request_body_limits(site: NginxServer, visitor: Cookies) -> None:
    """A 40 KiB body reaches the app, which refuses it with its JSON 413; 100 KiB never leaves
    nginx."""
    for size, from_app in ((40 * 1024, True), (100 * 1024, False)):
        body = json.dumps({"message": "x" * size, "conversation": None}).encode()
        response = raw_post(
            site.port,
            body,
            cookies=visitor,
            headers={"Content-Type": "application/json", "X-CSRFToken": visitor["csrftoken"]},
        )
        try:
            assert response.status == 413
            content = response.body()
            if from_app:
                assert json.loads(content)["error"]["code"] == "body_too_large"
            else:
                assert b"<html>" in content
        finally:
            response.sock.close()


def test_metrics_only_for_this_host(site: NginxServer) -> None:
    """/metrics through nginx answers loopback (127.0.0.1) and refuses any other address."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as other:
        assert other.get(site.url + "/metrics").status_code == 403
    with httpx.Client() as local:
        response = local.get(site.url + "/metrics")
    assert response.status_code == 200
    assert "ai_ttft_seconds" in response.text


# --- the OpenAI-compatible API (/v1/) -------------------------------------------------------

API_MODEL = "chatsite"
API_LIMITS = (
    SERVER_SNIPPET,
    "limit_conn chatsite_api_open 256;",
    "limit_conn chatsite_api_open 2;",
)
ERROR_FIELDS = {"message", "type", "param", "code"}


def api_key() -> str:
    """A new key, stored in the test database the workers share."""
    _, key = key_create(name="nginx", classroom=None, created_by=None)
    return key


def api_request(
    message: str, *, stream: bool = True, history: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    messages = [*(history or []), {"role": "user", "content": message}]
    return {"model": API_MODEL, "messages": messages, "stream": stream}


def post_api(
    port: int,
    key: str,
    payload: dict[str, Any] | bytes,
    *,
    headers: dict[str, str] | None = None,
    source: str | None = None,
) -> RawResponse:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    all_headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {key}",
        **(headers or {}),
    }
    return raw_post(port, body, headers=all_headers, path="/v1/chat/completions", source=source)


def api_stream(
    port: int, key: str, message: str, *, headers: dict[str, str] | None = None
) -> tuple[RawResponse, float, list[Event]]:
    """The response (its head), when the request was sent, and every message of the stream
    stamped with its arrival."""
    sent = time.monotonic()
    response = post_api(port, key, api_request(message), headers=headers)
    try:
        assert response.status == 200, (response.status, response.body())
        return response, sent, list(response.events())
    finally:
        response.sock.close()


def content_of(events: list[Event]) -> list[Event]:
    """The chunks that carry answer text (not the role, the finish, the usage or [DONE])."""
    chunks = [e for e in events if e.data != "[DONE]"]
    return [e for e in chunks if any(c["delta"].get("content") for c in e.json()["choices"])]


def api_gaps_ms(port: int, key: str, message: str) -> list[float]:
    _, _, events = api_stream(port, key, message)
    stamps = [e.at for e in content_of(events)]
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


def openai_error(response: RawResponse) -> dict[str, Any]:
    """The OpenAI error object of a JSON error response."""
    assert response.header("content-type") == "application/json", response.headers
    error = json.loads(response.body())["error"]
    assert set(error) == ERROR_FIELDS, error
    return error


def test_api_models_through_nginx(site: NginxServer) -> None:
    """GET /v1/models through nginx lists the model to a valid key; without a key the answer
    is the app's JSON 401 in OpenAI's format, not an nginx page."""
    key = api_key()
    with httpx.Client(base_url=site.url, timeout=10) as client:
        listed = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        refused = client.get("/v1/models")
    assert listed.status_code == 200
    assert listed.headers["content-type"] == "application/json"
    assert [model["id"] for model in listed.json()["data"]] == [API_MODEL]
    assert refused.status_code == 401
    assert refused.headers["content-type"] == "application/json"
    assert set(refused.json()["error"]) == ERROR_FIELDS
    assert refused.json()["error"]["code"] == "missing_api_key"


def test_api_stream_arrives_chunk_by_chunk(
    site: NginxServer, daphne: LiveServer, figures: dict[str, Any]
) -> None:
    """A streamed completion through nginx: five tokens 100 ms apart arrive about 100 ms apart,
    as they do directly (not in one burst at the end), uncompressed although the client accepts
    gzip and br, and the stream ends with data: [DONE]."""
    key = api_key()
    message = "[scripted tokens=5 ttft_ms=0 itl_ms=100] hi"
    direct = api_gaps_ms(daphne.port, key, message)
    response, _sent, events = api_stream(
        site.port, key, message, headers={"Accept-Encoding": "gzip, br"}
    )
    assert response.header("content-type") == "text/event-stream; charset=utf-8"
    assert response.header("content-encoding") is None
    assert response.header("x-accel-buffering") is None
    assert events[-1].data == "[DONE]"
    content = content_of(events)
    assert len(content) == 5
    proxied = [(b.at - a.at) * 1000 for a, b in itertools.pairwise(content)]
    figures["api_gap_ms_median"] = {
        "direct": round(statistics.median(direct), 2),
        "nginx": round(statistics.median(proxied), 2),
    }
    # Buffered, all five would arrive together 400 ms after the first was sent. Generous
    # bounds: a loaded machine delays single chunks, never spreads a burst out.
    assert (content[-1].at - content[0].at) * 1000 > 250, proxied
    assert statistics.median(proxied) > 60, proxied


def test_api_long_conversation_passes_nginx(site: NginxServer, workers: list[LiveServer]) -> None:
    """A completion carrying a 100 KiB conversation (more than the page's 64 KiB) reaches the
    app whole and is answered; 300 KiB gets the app's JSON 413 (over its 256 KiB), and 600 KiB
    nginx's own 413, in the same OpenAI format, without reaching a worker."""
    key = api_key()
    tag = f"api-long-{uuid.uuid4().hex[:8]}"
    history = [
        {"role": ("user", "assistant")[n % 2], "content": f"{n}: " + "x" * 3500} for n in range(30)
    ]
    payload = api_request(
        f"[scripted tokens=2 ttft_ms=0 tag={tag}] So?", stream=False, history=history
    )
    body = json.dumps(payload).encode()
    assert 96 * 1024 < len(body) < 128 * 1024
    response = post_api(site.port, key, body)
    try:
        assert response.status == 200, response.body()
        assert json.loads(response.body())["choices"][0]["message"]["content"]
    finally:
        response.sock.close()

    def started() -> dict[str, Any] | None:
        rows = [row for worker in workers for row in worker.engine_events(tag)]
        return next((row for row in rows if row["event"] == "start"), None)

    given = wait_for(started)["given"]
    assert given[-len(payload["messages"]) :] == [
        [m["role"], m["content"]] for m in payload["messages"]
    ]

    for size, request_id, upstream in (
        (300 * 1024, "api-too-large-app-01", "us=413"),
        (600 * 1024, "api-too-large-nginx1", "us=-"),
    ):
        big = json.dumps(api_request("x" * size)).encode()
        response = post_api(site.port, key, big, headers={"X-Request-Id": request_id})
        try:
            assert response.status == 413
            assert openai_error(response)["code"] == "body_too_large"
        finally:
            response.sock.close()
        assert f" {upstream}" in logged(site, f"rid={request_id} ")


def test_api_streams_have_their_own_allowance(
    nginx_factory, workers: list[LiveServer], visitor: Cookies
) -> None:
    """The API's open-request limit per address (lowered here from 256 to 2) is its own: a third
    stream from one address gets nginx's 429 in OpenAI's format with Retry-After, while a
    student's question from the same address is still answered."""
    variant = nginx_factory(SITE, [w.port for w in workers], edits=[API_LIMITS])
    key = api_key()
    source = "127.0.1.10"
    tags = [f"api-held-{n}-{uuid.uuid4().hex[:8]}" for n in range(2)]
    held = []
    try:
        for tag in tags:
            body = json.dumps(api_request(f"[scripted hang=1 tag={tag}] wait")).encode()
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
            held.append(
                raw_post_send(
                    variant.port, body, headers=headers, path="/v1/chat/completions", source=source
                )
            )
        for tag in tags:
            wait_for(lambda tag=tag: [row for w in workers for row in w.engine_events(tag)])
        refused = post_api(variant.port, key, api_request("[scripted tokens=1] me?"), source=source)
        try:
            assert refused.status == 429
            assert refused.header("retry-after") == "2"
            error = openai_error(refused)
            assert (error["code"], error["type"]) == ("proxy_limited", "rate_limit_error")
        finally:
            refused.sock.close()
        _, events = answer(variant.port, visitor, "[scripted tokens=1 ttft_ms=0] Hi", source=source)
        assert events[-1].event == "done"
    finally:
        for sock in held:
            sock.close()


# --- splitting at nginx (chatsite-split.conf) ----------------------------------------------


@pytest.fixture(scope="module")
def split_site(nginx_factory, workers: list[LiveServer]) -> NginxServer:
    return nginx_factory(SPLIT_SITE, [w.port for w in workers])


_visitors = itertools.count()


def visitor_path(server: NginxServer) -> tuple[Cookies, str]:
    """A new session (from the page, through nginx) and the path both its answers took. Each
    visitor comes from an address of its own, as a crowd of browsers does (nginx limits what
    one address may ask)."""
    number = next(_visitors)
    source = f"127.0.{2 + number // 250}.{1 + number % 250}"
    cookies = page_visit(server.port, source)
    message = "[scripted tokens=1 ttft_ms=0] Which path?"
    paths = {
        meta_of(answer(server.port, cookies, message, source=source)[1])["path"] for _ in range(2)
    }
    assert len(paths) == 1, f"session {cookies['sessionid']} went to {paths}"
    return cookies, paths.pop()


def test_split_share_and_stickiness(split_site: NginxServer, figures: dict[str, Any]) -> None:
    """Sessions go to the candidate in about the configured 10 % share, each session always to
    the same path."""
    with ThreadPoolExecutor(4) as pool:
        paths = [path for _, path in pool.map(lambda _: visitor_path(split_site), range(200))]
    share = paths.count("django") / len(paths)
    figures["split_candidate_share"] = share
    assert 0.03 <= share <= 0.2, share


def test_split_without_session_is_refused(split_site: NginxServer, visitor: Cookies) -> None:
    """A request without a session cookie (it hashes to the baseline) is refused as the page
    expects: 403 ``session_required``, as JSON."""
    body = json.dumps({"message": "[scripted tokens=1 ttft_ms=0] Anyone?", "conversation": None})
    cookies = {"csrftoken": visitor["csrftoken"]}
    headers = {"Content-Type": "application/json", "X-CSRFToken": visitor["csrftoken"]}
    response = raw_post(split_site.port, body.encode(), cookies=cookies, headers=headers)
    try:
        assert response.status == 403
        assert json.loads(response.body())["error"]["code"] == "session_required"
    finally:
        response.sock.close()


@pytest.fixture(scope="module")
def candidate_visitor(split_site: NginxServer) -> Cookies:
    """A session the split sends to the candidate."""
    for _ in range(100):
        cookies, path = visitor_path(split_site)
        if path == "django":
            return cookies
    pytest.fail("no session went to the candidate in 100 tries")


def test_candidate_failure_before_answer_falls_back_to_baseline(
    nginx_factory, daphne_factory, candidate_visitor: Cookies
) -> None:
    """When the candidate answers 503 before its stream starts, nginx sends the same request,
    body included, to the baseline, and the student gets a whole answer."""
    broken = daphne_factory(CHATSITE_DJANGO_ENGINE_ALIAS="not-configured")
    message = "[scripted tokens=4 ttft_ms=0] Still there?"
    refused = post_chat(broken.port, candidate_visitor, message, path="/api/chat/stream/django")
    assert refused.status == 503, refused.body()
    refused.sock.close()

    site = nginx_factory(SPLIT_SITE, [broken.port, broken.port])
    _, events = answer(site.port, candidate_visitor, message)
    assert meta_of(events)["path"] == "direct"
    assert len(tokens_of(events)) == 4 and events[-1].event == "done"
    assert "us=503 : 200" in logged(site, "POST /api/chat/stream ")


def test_candidate_failure_mid_answer_is_not_retried(
    split_site: NginxServer, candidate_visitor: Cookies
) -> None:
    """A candidate stream that fails after its first tokens ends with its error event; nginx
    cannot retry a response that has started."""
    _, events = answer(
        split_site.port, candidate_visitor, "[scripted tokens=5 ttft_ms=0 fail_after=2] Half?"
    )
    assert meta_of(events)["path"] == "django"
    assert len(tokens_of(events)) == 2
    assert events[-1].event == "error"


# --- resuming through nginx -----------------------------------------------------------------


def dropped_and_resumed(
    port: int, cookies: Cookies, *, tokens: int, source: str | None = None
) -> tuple[str, list[Event]]:
    """An answer of ``tokens`` whose connection drops after its third token, then resumed
    from there: its request id and the resume's events."""
    response = post_chat(
        port, cookies, f"[scripted tokens={tokens} itl_ms=30] Go on", source=source
    )
    events: list[Event] = []
    for event in response.events():
        events.append(event)
        if len(tokens_of(events)) == 3:
            break
    response.sock.close()
    request_id = meta_of(events)["request_id"]
    headers = {
        "Content-Type": "application/json",
        "X-CSRFToken": cookies["csrftoken"],
        "Last-Event-ID": "3",
    }
    body = json.dumps({"request_id": request_id}).encode()
    resumed = raw_post(
        port, body, cookies=cookies, headers=headers, path="/api/chat/resume", source=source
    )
    try:
        assert resumed.status == 200, resumed.body()
        return request_id, list(resumed.events())
    finally:
        resumed.sock.close()


def test_a_dropped_answer_resumes_on_its_own_worker(nginx_factory, daphne_factory) -> None:
    """Two workers with resuming on: for every session, the resume of a dropped answer reaches
    the worker that runs it (the chat upstream hashes the session cookie) and brings exactly the
    missing tokens."""
    workers = [daphne_factory(CHATSITE_RESUME_GRACE_S="5") for _ in range(2)]
    site = nginx_factory(SITE, [worker.port for worker in workers])
    for _ in range(8):
        cookies = page_visit(site.port)
        _, after = dropped_and_resumed(site.port, cookies, tokens=12)
        assert [int(e.id) for e in tokens_of(after)] == list(range(4, 13))
        assert after[-1].event == "done"
    # The sessions were spread over both workers, so the hash really had to pick the right one.
    used = {
        f"127.0.0.1:{w.port}"
        for w in workers
        if f"127.0.0.1:{w.port}" in site.access_log.read_text()
    }
    assert len(used) == 2, used
