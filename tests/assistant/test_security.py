"""Security defaults over real HTTP against Daphne, and settings that refuse to start unsafe.

Already covered elsewhere, so not repeated here: the page's CSP through Django's test client
(``test_views``), CSRF and Origin checks on the stream (``test_consumers_input``), another
session's beacon (``test_telemetry``), history and the default stream URL with another session's
conversation (``test_conversations_http``), and the dashboard's rules in detail
(``test_dashboard_views``).
"""

import json
import os
import secrets
import subprocess
import sys
import uuid
from http.cookies import SimpleCookie

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assistant.engines.scripted import default_tokens
from assistant.models import Message
from chatsite.settings import _DEV_SECRET_KEY
from tests.support import (
    REDIS_URL,
    ROOT,
    ChatClient,
    LiveServer,
    RawResponse,
    raw_post,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

STREAM_URLS = ("/api/chat/stream/direct", "/api/chat/stream/django")


def get(server: LiveServer, path: str, **kwargs) -> tuple[RawResponse, bytes]:
    response = raw_post(server.port, b"", method="GET", path=path, **kwargs)
    try:
        return response, response.body()
    finally:
        response.sock.close()


def set_cookies(response: RawResponse) -> dict[str, dict[str, str | bool]]:
    """Each cookie the response sets, with its attributes (names lower-cased)."""
    cookies: dict[str, dict[str, str | bool]] = {}
    for name, value in response.headers:
        if name != "set-cookie":
            continue
        parsed = SimpleCookie()
        parsed.load(value)
        for morsel in parsed.values():
            attributes = {key: morsel[key] for key in ("httponly", "secure", "samesite")}
            cookies[morsel.key] = {**attributes, "value": morsel.value}
    return cookies


def csp_directives(response: RawResponse) -> dict[str, list[str]]:
    policy = response.header("content-security-policy")
    assert policy, f"no Content-Security-Policy: {response.headers}"
    directives = {}
    for part in policy.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


def assert_page_headers(response: RawResponse) -> None:
    """What a response the browser might render or frame must carry."""
    directives = csp_directives(response)
    script_src = directives.get("script-src", directives.get("default-src"))
    assert script_src is not None and "'unsafe-inline'" not in script_src, directives
    assert "'unsafe-eval'" not in script_src, directives
    assert directives["frame-ancestors"] == ["'none'"], directives
    assert directives["object-src"] == ["'none'"], directives
    assert response.header("x-frame-options") == "DENY"
    assert response.header("x-content-type-options") == "nosniff"
    assert response.header("referrer-policy") == "same-origin"


def test_pages_and_the_api_carry_the_security_headers(
    chat_client: ChatClient, daphne: LiveServer
) -> None:
    """The page, the history API, an API error, the beacon and the stream on the ``django``
    path: a CSP without inline script that forbids framing, nosniff and a referrer policy."""
    page, html = get(daphne, "/")
    assert page.status == 200
    assert_page_headers(page)
    assert b"<script>" not in html and b'<script type="module"' in html

    cookies = chat_client.cookies()
    for path in ("/api/conversations", f"/api/conversations/{uuid.uuid4()}"):
        response, _ = get(daphne, path, cookies=cookies)
        assert response.status in (200, 404)
        assert_page_headers(response)

    beacon = chat_client.raw(b"{}", path="/api/chat/beacon")
    assert beacon.status in (400, 403)
    assert_page_headers(beacon)
    beacon.sock.close()

    for body in ({"message": "[scripted tokens=1 ttft_ms=0]"}, b"{"):
        response = chat_client.raw(body, path="/api/chat/stream/django")
        assert_page_headers(response)
        response.body()
        response.sock.close()


@pytest.mark.parametrize("url", STREAM_URLS)
@pytest.mark.parametrize(
    ("method", "body", "headers"),
    [
        ("POST", {"message": "[scripted tokens=1 ttft_ms=0]"}, {}),
        ("POST", b"{", {}),
        ("POST", b"{}", {"Content-Type": "text/plain"}),
        ("GET", b"", {}),
    ],
    ids=["stream", "bad-json", "wrong-type", "wrong-method"],
)
def test_every_stream_endpoint_answer_forbids_sniffing(
    chat_client: ChatClient, url: str, method: str, body, headers: dict[str, str]
) -> None:
    """A stream, or an error from the path or the router before it, is never content-sniffed
    into something a browser would render."""
    response = chat_client.raw(body, headers=headers, path=url, method=method)
    try:
        assert response.header("x-content-type-options") == "nosniff"
        assert response.header("content-type") in (
            "application/json",
            "text/event-stream; charset=utf-8",
        )
    finally:
        response.sock.close()


def test_session_and_csrf_cookies_are_httponly_and_samesite(daphne: LiveServer) -> None:
    """The session cookie is out of reach of script; both cookies stay on same-site requests.
    (The CSRF cookie is read by the page's script, so it is not HttpOnly.) Without TLS
    settings, over plain HTTP, they are not marked Secure."""
    response, _ = get(daphne, "/")
    cookies = set_cookies(response)
    assert set(cookies) >= {"sessionid", "csrftoken"}
    assert cookies["sessionid"]["httponly"] is True
    assert cookies["sessionid"]["samesite"] == "Lax"
    assert cookies["csrftoken"]["samesite"] == "Lax"
    assert not cookies["sessionid"]["secure"] and not cookies["csrftoken"]["secure"]


HTTPS = {"X-Forwarded-Proto": "https"}


def test_behind_tls_cookies_are_secure_and_hsts_is_sent(production: LiveServer) -> None:
    response, _ = get(production, "/", headers=HTTPS)
    assert response.status == 200
    assert response.header("strict-transport-security") == "max-age=31536000"
    assert_page_headers(response)
    cookies = set_cookies(response)
    assert cookies["sessionid"]["secure"] is True and cookies["sessionid"]["httponly"] is True
    assert cookies["csrftoken"]["secure"] is True
    assert {c["samesite"] for c in cookies.values()} == {"Lax"}

    # A request that did not come over TLS is not told to use TLS from now on.
    plain, _ = get(production, "/", headers={"X-Forwarded-Proto": "http"})
    assert plain.header("strict-transport-security") is None


@pytest.mark.parametrize("url", STREAM_URLS)
def test_behind_tls_a_renewed_session_is_secure_and_streams(
    production: LiveServer, url: str
) -> None:
    """A stream without a session is refused; the session ``POST /api/session`` then issues
    (what the page does) has a Secure, HttpOnly cookie and streams, on both serving paths."""
    page, _ = get(production, "/", headers=HTTPS)
    token = str(set_cookies(page)["csrftoken"]["value"])
    origin = f"https://127.0.0.1:{production.port}"
    headers = {"X-CSRFToken": token, "Origin": origin, **HTTPS}
    body = b'{"message": "[scripted tokens=1 ttft_ms=0] hello"}'
    json_headers = {"Content-Type": "application/json", **headers}
    refused = raw_post(
        production.port, body, cookies={"csrftoken": token}, headers=json_headers, path=url
    )
    try:
        assert refused.status == 403 and b"session_required" in refused.body()
    finally:
        refused.sock.close()
    renewed = raw_post(
        production.port, b"", cookies={"csrftoken": token}, headers=headers, path="/api/session"
    )
    try:
        assert renewed.status == 204, renewed.body()
        session = set_cookies(renewed)["sessionid"]
        assert session["secure"] is True and session["httponly"] is True
    finally:
        renewed.sock.close()
    cookies = {"csrftoken": token, "sessionid": str(session["value"])}
    response = raw_post(production.port, body, cookies=cookies, headers=json_headers, path=url)
    try:
        assert response.status == 200, response.body()
        assert [e.event for e in response.events()][-1] == "done"
    finally:
        response.sock.close()


def test_with_debug_off_errors_reveal_nothing(production: LiveServer) -> None:
    """A 404, and a request for a host that is not served, show no debug page."""
    missing, body = get(production, "/no-such-page", headers=HTTPS)
    assert missing.status == 404
    for leak in (b"URLconf", b"Traceback", b"DEBUG = True", b"settings"):
        assert leak not in body, leak
    wrong_host, body = get(production, "/", headers={"Host": "evil.example", **HTTPS})
    assert wrong_host.status == 400
    assert b"ALLOWED_HOSTS" not in body and b"Traceback" not in body


# --- settings that must refuse to start ---------------------------------------------------------

GOOD_KEY = "k" * 20 + secrets.token_hex(15)
PRODUCTION = {
    "CHATSITE_PROFILE": "production",
    "DJANGO_SECRET_KEY": GOOD_KEY,
    "DJANGO_ALLOWED_HOSTS": "chat.example.org",
    "DATABASE_URL": "postgres://chatsite@127.0.0.1:5432/chatsite",
    "CHATSITE_REDIS_URL": REDIS_URL,
}
DEBUG_OFF = {
    "CHATSITE_DEBUG": "0",
    "DJANGO_SECRET_KEY": GOOD_KEY,
    "DJANGO_ALLOWED_HOSTS": "chat.example.org",
}


def django_setup(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``django.setup()`` in a fresh interpreter with only ``env`` for chatsite's settings
    (whatever this test run was started with is left out)."""
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CHATSITE_", "DJANGO_")) and key != "DATABASE_URL"
    }
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "chatsite.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({**DEBUG_OFF, "DJANGO_SECRET_KEY": ""}, "DJANGO_SECRET_KEY must be set"),
        ({**DEBUG_OFF, "DJANGO_SECRET_KEY": "s" * 39}, "DJANGO_SECRET_KEY must be set"),
        ({**DEBUG_OFF, "DJANGO_SECRET_KEY": _DEV_SECRET_KEY}, "DJANGO_SECRET_KEY must be set"),
        ({**DEBUG_OFF, "DJANGO_ALLOWED_HOSTS": ""}, "DJANGO_ALLOWED_HOSTS must list"),
        ({**DEBUG_OFF, "DJANGO_ALLOWED_HOSTS": "*"}, "DJANGO_ALLOWED_HOSTS must list"),
        ({**DEBUG_OFF, "DJANGO_ALLOWED_HOSTS": "chat.example.org, *"}, "DJANGO_ALLOWED_HOSTS"),
        ({**PRODUCTION, "CHATSITE_DEBUG": "1"}, "CHATSITE_DEBUG must be off"),
        ({**PRODUCTION, "DATABASE_URL": ""}, "DATABASE_URL must point at PostgreSQL"),
        ({**PRODUCTION, "DATABASE_URL": "sqlite:///db.sqlite3"}, "DATABASE_URL must be"),
        ({**PRODUCTION, "CHATSITE_REDIS_URL": ""}, "CHATSITE_REDIS_URL must point at Redis"),
        ({"CHATSITE_PROFILE": "staging"}, "CHATSITE_PROFILE must be"),
        ({"CHATSITE_PROFILE": "Production"}, "CHATSITE_PROFILE must be"),
    ],
    ids=[
        "no-secret-key",
        "short-secret-key",
        "development-secret-key",
        "no-allowed-hosts",
        "any-host",
        "any-host-among-others",
        "production-with-debug",
        "production-without-database",
        "production-with-sqlite",
        "production-without-redis",
        "unknown-profile",
        "profile-in-the-wrong-case",
    ],
)
def test_unsafe_settings_refuse_to_start(env: dict[str, str], problem: str) -> None:
    result = django_setup(env)
    assert result.returncode != 0, result.stdout
    assert "ImproperlyConfigured" in result.stderr, result.stderr[-2000:]
    assert problem in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("env", [{}, DEBUG_OFF, PRODUCTION], ids=["local", "debug-off", "prod"])
def test_safe_settings_start(env: dict[str, str]) -> None:
    """The settings the refusals above are measured against do start (nothing connects yet)."""
    result = django_setup(env)
    assert result.returncode == 0, result.stderr[-2000:]


# --- the dashboard and other sessions' data -----------------------------------------------------


def test_the_dashboard_needs_a_staff_login(daphne: LiveServer) -> None:
    """Over real HTTP: anonymous visitors go to the login page, other users get 403."""
    page, _ = get(daphne, "/dashboard/")
    assert page.status == 302
    assert page.header("location") == "/admin/login/?next=/dashboard/"
    snapshot, body = get(daphne, "/dashboard/api/snapshot")
    assert snapshot.status == 401 and json.loads(body)["error"]["code"] == "login_required"

    student = Client()
    student.force_login(get_user_model().objects.create_user("pupil", is_staff=False))
    cookies = {"sessionid": student.cookies["sessionid"].value}
    for path in ("/dashboard/", "/dashboard/api/snapshot", "/dashboard/events"):
        response, _ = get(daphne, path, cookies=cookies)
        assert response.status == 403, path


@pytest.mark.parametrize("url", STREAM_URLS)
def test_another_sessions_conversation_cannot_be_continued(
    chat_client: ChatClient, daphne: LiveServer, url: str
) -> None:
    """On each serving path, continuing someone else's conversation is a 404
    ``conversation_not_found``, and nothing is added to it; reading it is a 404 too."""
    meta = chat_client.ask("[scripted tokens=2 ttft_ms=0] my private question", url=url)[0].json()
    conversation = meta["conversation"]
    wait_for(lambda: Message.objects.filter(id=meta["message"]).exists())

    intruder = ChatClient(daphne)
    try:
        response = intruder.raw(
            {"message": "[scripted tokens=2 ttft_ms=0] let me in", "conversation": conversation},
            path=url,
        )
        assert response.status == 404
        assert json.loads(response.body())["error"]["code"] == "conversation_not_found"
        assert intruder.client.get(f"/api/conversations/{conversation}").status_code == 404
    finally:
        intruder.close()
    assert Message.objects.filter(conversation_id=conversation).count() == 2
    mine = chat_client.client.get(f"/api/conversations/{conversation}").json()["messages"]
    assert [(m["role"], m["content"]) for m in mine] == [
        ("user", "[scripted tokens=2 ttft_ms=0] my private question"),
        ("assistant", "".join(default_tokens(2))),
    ]
