"""Every response carries the same security headers as Django's pages, whichever layer sends it:
a stream on either serving path, a JSON error from the router (405, 415, 413), from the
Channels consumer (CSRF, bad JSON, no session) or from a Django view, and the probes. Behind
TLS each of them carries HSTS too; over plain HTTP none does. Real Daphne, raw sockets."""

from collections.abc import Callable
from http.cookies import SimpleCookie

import pytest

from tests.support import LiveServer, RawResponse, raw_post

pytestmark = pytest.mark.django_db(transaction=True)

SECURITY_HEADERS = (
    "content-security-policy",
    "x-frame-options",
    "x-content-type-options",
    "referrer-policy",
    "cross-origin-opener-policy",
    "strict-transport-security",
)
STREAM = b'{"message": "[scripted tokens=1 ttft_ms=0] hello"}'


def security_of(response: RawResponse) -> dict[str, str]:
    """The response's security headers, each of which must be sent once at most."""
    found = {}
    for name in SECURITY_HEADERS:
        assert response.header_count(name) <= 1, name
        value = response.header(name)
        if value is not None:
            found[name] = value
    return found


def cookies_of(response: RawResponse) -> dict[str, str]:
    cookies: dict[str, str] = {}
    for name, value in response.headers:
        if name == "set-cookie":
            parsed = SimpleCookie()
            parsed.load(value)
            cookies.update({morsel.key: morsel.value for morsel in parsed.values()})
    return cookies


def answers(server: LiveServer, extra: dict[str, str]) -> dict[str, Callable[[], RawResponse]]:
    """One request of each kind the site answers, by name."""
    page = raw_post(server.port, b"", method="GET", path="/", headers=extra)
    cookies = cookies_of(page)
    page.body()
    page.sock.close()
    origin = ("https" if extra else "http") + f"://127.0.0.1:{server.port}"
    token = {"X-CSRFToken": cookies["csrftoken"], "Origin": origin, **extra}
    as_json = {"Content-Type": "application/json", **token}

    def post(
        path: str, body: bytes, headers: dict[str, str], **kwargs
    ) -> Callable[[], RawResponse]:
        return lambda: raw_post(server.port, body, headers=headers, path=path, **kwargs)

    kinds: dict[str, Callable[[], RawResponse]] = {
        "page": post("/", b"", extra, method="GET"),
        "healthz": post("/healthz", b"", extra, method="GET"),
        "readyz": post("/readyz", b"", extra, method="GET"),
        "history API": post("/api/conversations", b"", extra, method="GET", cookies=cookies),
    }
    for url in ("/api/chat/stream/direct", "/api/chat/stream/django"):
        side = url.rsplit("/", 1)[1]
        kinds |= {
            f"{side} stream": post(url, STREAM, as_json, cookies=cookies),
            f"{side} bad JSON": post(url, b"{", as_json, cookies=cookies),
            f"{side} no session": post(
                url, STREAM, as_json, cookies={"csrftoken": token["X-CSRFToken"]}
            ),
            f"{side} CSRF": post(
                url, STREAM, {"Content-Type": "application/json", **extra}, cookies=cookies
            ),
            f"{side} 405": post(url, b"", extra, method="GET"),
            f"{side} 415": post(
                url, STREAM, {"Content-Type": "text/plain", **token}, cookies=cookies
            ),
            f"{side} 413": post(url, b"{" + b" " * 40_000 + b"}", as_json, cookies=cookies),
        }
    return kinds


def headers_by_kind(
    server: LiveServer, extra: dict[str, str]
) -> dict[str, tuple[int, dict[str, str]]]:
    seen = {}
    for name, request in answers(server, extra).items():
        response = request()
        try:
            seen[name] = (response.status, security_of(response))
            response.body()
        finally:
            response.sock.close()
    return seen


def test_every_response_carries_the_pages_security_headers(daphne: LiveServer) -> None:
    seen = headers_by_kind(daphne, {})
    status, page = seen["page"]
    assert status == 200 and set(page) == set(SECURITY_HEADERS) - {"strict-transport-security"}
    assert "frame-ancestors 'none'" in page["content-security-policy"]
    statuses = {name: status for name, (status, _) in seen.items()}
    assert statuses["direct stream"] == statuses["django stream"] == 200
    assert statuses["direct 413"] == statuses["django 413"] == 413
    assert statuses["direct no session"] == statuses["direct CSRF"] == 403
    different = {name: headers for name, (_, headers) in seen.items() if headers != page}
    assert different == {}


def test_behind_tls_every_response_carries_hsts(production: LiveServer) -> None:
    seen = headers_by_kind(production, {"X-Forwarded-Proto": "https"})
    status, page = seen["page"]
    assert status == 200 and page["strict-transport-security"] == "max-age=31536000"
    assert {name: headers for name, (_, headers) in seen.items() if headers != page} == {}
    plain = headers_by_kind(production, {"X-Forwarded-Proto": "http"})
    assert {n for n, (_, h) in plain.items() if "strict-transport-security" in h} == set()
