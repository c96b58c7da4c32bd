"""The chat stream's quick CSRF verdict (``assistant.csrf``) held against Django's own check.

``csrf_passes`` may only ever say True where Django's ``CsrfViewMiddleware`` passes the same
request (every refusal stays Django's), and must say it for the page's own questions, or the
quick path saves nothing. Each test below runs both on every request of a grid: tokens right,
wrong, masked, malformed or missing; the site's origin, another, a trusted one, none; HTTP,
HTTPS and a proxy's header; allowed and refused hosts; JSON and form bodies.
"""

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from django.middleware.csrf import _get_new_csrf_string, _mask_cipher_secret

from assistant import csrf, http
from assistant.scope_headers import scope_cookies, scope_meta

SECRET = _get_new_csrf_string()
OTHER = _get_new_csrf_string()
HOST = "school.example:8443"
TRUSTED = "https://trusted.example"
#: A token with a character outside the alphabet: sent as the cookie and as the header alike.
MALFORMED = SECRET[:-1] + "-"

#: What the page (and every client that follows it) sends as X-CSRFToken, and a wrong one each
#: way a token can be wrong; None: no header.
TOKENS: dict[str, str | None] = {
    "the cookie's secret": SECRET,
    "the secret masked": _mask_cipher_secret(SECRET),
    "another secret": OTHER,
    "another secret masked": _mask_cipher_secret(OTHER),
    "a character outside the alphabet": MALFORMED,
    "too short": SECRET[:-1],
    "empty": "",
    "none": None,
}
COOKIES: dict[str, str | None] = {
    "the secret": SECRET,
    "the secret masked (Django before 4.0)": _mask_cipher_secret(SECRET),
    "malformed": MALFORMED,
    "none": None,
}
ORIGINS: list[str | None] = [
    None,
    f"http://{HOST}",
    f"https://{HOST}",
    "http://evil.example",
    TRUSTED,
    "null",
]


def scope_of(
    *,
    token: str | None,
    cookie: str | None,
    origin: str | None,
    scheme: str = "http",
    host: str | None = HOST,
    content_type: str = "application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> dict[str, Any]:
    headers = [(b"content-type", content_type.encode())]
    if host is not None:
        headers.append((b"host", host.encode()))
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if token is not None:
        headers.append((b"x-csrftoken", token.encode()))
    cookies = "sessionid=abc; chatsite_class=def"
    if cookie is not None:
        cookies += f"; csrftoken={cookie}"
    headers.append((b"cookie", cookies.encode()))
    return {
        "type": "http",
        "method": "POST",
        "scheme": scheme,
        "path": "/api/chat/stream/direct",
        "query_string": b"",
        "root_path": "",
        "server": ("10.0.0.5", 8001),
        "client": ("10.0.0.9", 50000),
        "headers": headers + (extra or []),
    }


def verdicts(scope: dict[str, Any], body: bytes = b"{}") -> tuple[bool, bool]:
    """(the quick verdict, Django's) on ``scope``."""
    quick = csrf.csrf_passes(scope)
    django = http.csrf_error(http.asgi_request(scope, body)) is None
    return quick, django


def grid(**fixed: Any) -> Iterator[tuple[str, str, str | None, dict[str, Any]]]:
    for (token_name, token), (cookie_name, cookie), origin in itertools.product(
        TOKENS.items(), COOKIES.items(), ORIGINS
    ):
        yield (
            token_name,
            cookie_name,
            origin,
            scope_of(token=token, cookie=cookie, origin=origin, **fixed),
        )


@pytest.fixture(autouse=True)
def _site(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["school.example"]
    settings.CSRF_TRUSTED_ORIGINS = [TRUSTED]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_quick_passes_only_what_django_passes_and_all_the_page_sends(scheme: str) -> None:
    """Over HTTP and HTTPS: where a right token meets a right cookie from the site's own origin,
    both pass; where Django refuses, the quick check never passes; the only requests left to
    Django that it passes are a trusted origin's and (over HTTPS) one without an Origin."""
    right_tokens = {"the cookie's secret", "the secret masked"}
    right_cookies = {"the secret", "the secret masked (Django before 4.0)"}
    own = f"{scheme}://{HOST}"
    quick_passed = 0
    for token_name, cookie_name, origin, scope in grid(scheme=scheme):
        quick, django = verdicts(scope)
        case = (scheme, token_name, cookie_name, origin)
        assert django or not quick, case
        right = token_name in right_tokens and cookie_name in right_cookies
        if right and (origin == own or (origin is None and scheme == "http")):
            assert quick and django, case
        elif django and not quick:
            assert origin == TRUSTED or (origin is None and scheme == "https"), case
        quick_passed += quick
    assert quick_passed == 4 * (2 if scheme == "http" else 1)


def test_a_proxy_saying_https_is_believed_only_where_the_site_says_so(settings: Any) -> None:
    """Behind nginx the scope is HTTP and X-Forwarded-Proto says HTTPS: the site's origin is then
    https://..., as Django's ``is_secure`` has it with SECURE_PROXY_SSL_HEADER, and not without."""
    proto = [(b"x-forwarded-proto", b"https")]
    for trust in (True, False):
        settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if trust else None
        for _, _, origin, scope in grid(extra=proto):
            quick, django = verdicts(scope)
            assert django or not quick, (trust, origin)
        own = scope_of(token=SECRET, cookie=SECRET, origin=f"https://{HOST}", extra=proto)
        plain = scope_of(token=SECRET, cookie=SECRET, origin=f"http://{HOST}", extra=proto)
        assert verdicts(own) == (trust, trust)
        assert verdicts(plain) == (not trust, not trust)


def test_the_host_is_djangos(settings: Any) -> None:
    """A host ALLOWED_HOSTS refuses, a request without a Host header, and X-Forwarded-Host
    (believed only with USE_X_FORWARDED_HOST): the quick check agrees with Django or defers."""
    cases: list[tuple[str | None, list[tuple[bytes, bytes]]]] = [
        ("evil.example", []),
        (None, []),
        ("evil.example", [(b"x-forwarded-host", HOST.encode())]),
        (HOST, [(b"x-forwarded-host", b"evil.example")]),
    ]
    for forwarded in (False, True):
        settings.USE_X_FORWARDED_HOST = forwarded
        for host, extra in cases:
            for origin in (f"http://{HOST}", "http://evil.example", None):
                scope = scope_of(token=SECRET, cookie=SECRET, origin=origin, host=host, extra=extra)
                quick, django = verdicts(scope)
                assert django or not quick, (forwarded, host, extra, origin)
    settings.USE_X_FORWARDED_HOST = True
    forwarded_own = scope_of(
        token=SECRET,
        cookie=SECRET,
        origin=f"http://{HOST}",
        host="internal:8001",
        extra=[(b"x-forwarded-host", HOST.encode())],
    )
    assert verdicts(forwarded_own) == (True, True)
    settings.ALLOWED_HOSTS = ["other.example"]  # a changed setting is not answered from memory
    assert verdicts(forwarded_own) == (False, False)


def test_a_form_body_and_odd_headers_are_left_to_django(settings: Any) -> None:
    """A form's token in its body, a token sent twice (joined with a comma, as Django joins
    them), a header named with an underscore (Django ignores it), and CSRF_USE_SESSIONS."""
    form = scope_of(
        token=None,
        cookie=SECRET,
        origin=None,
        content_type="application/x-www-form-urlencoded",
    )
    assert verdicts(form, f"csrfmiddlewaretoken={SECRET}".encode()) == (False, True)
    twice = scope_of(
        token=SECRET, cookie=SECRET, origin=None, extra=[(b"x-csrftoken", SECRET.encode())]
    )
    assert verdicts(twice) == (False, False)
    underscore = scope_of(
        token=None, cookie=SECRET, origin=None, extra=[(b"x_csrftoken", SECRET.encode())]
    )
    assert verdicts(underscore) == (False, False)
    settings.CSRF_USE_SESSIONS = True
    assert csrf.csrf_passes(scope_of(token=SECRET, cookie=SECRET, origin=None)) is False


def test_headers_and_cookies_read_as_django_reads_them() -> None:
    """``scope_meta`` and ``scope_cookies`` against ``ASGIRequest``: repeated headers,
    repeated cookie headers, a cookie header ending in "; ", an underscore, odd bytes."""
    scope = scope_of(
        token=SECRET,
        cookie=SECRET,
        origin="http://a.example",
        extra=[
            (b"origin", b"http://b.example"),
            (b"cookie", b"lang=zh-hans; "),
            (b"x_forwarded_host", b"evil.example"),
            (b"user-agent", "Mozilla/5.0 (\u00e9)".encode("latin-1")),
            (b"content-length", b"2"),
        ],
    )
    request = http.asgi_request(scope, b"{}")
    meta = scope_meta(scope)
    headers = {
        k: v for k, v in request.META.items() if k.startswith("HTTP_") or k.startswith("CONTENT_")
    }
    assert meta == headers
    assert scope_cookies(scope) == request.COOKIES
    assert meta["HTTP_ORIGIN"] == "http://a.example,http://b.example"
