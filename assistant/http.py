"""HTTP helpers: JSON errors for every layer, and what ASGI consumers running without Django's
middleware stack need of it (CSRF, hosts, security headers)."""

import functools
import io
import json
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.core.signals import setting_changed
from django.http import HttpResponse
from django.http.request import split_domain_port, validate_host
from django.utils.csp import CSP, build_policy

from assistant import conf, errors, metrics
from assistant.internals import CsrfCheck as _CsrfCheck
from assistant.scope_headers import scope_meta
from assistant.services.classrooms import CLASS_COOKIE

type Headers = list[tuple[bytes, bytes]]


def _protected_view() -> None:
    """Stands for the consumer: not csrf_exempt, so the full check applies."""


def asgi_request(scope: Any, body: bytes) -> ASGIRequest:
    return ASGIRequest(scope, io.BytesIO(body))


def csrf_error(request: ASGIRequest) -> errors.ApiError | None:
    """Run the checks CsrfViewMiddleware runs for a view (Origin, Referer, token)."""
    check = _CsrfCheck(lambda r: None)  # type: ignore[arg-type,return-value]
    try:
        check.process_request(request)
        reason = check.process_view(request, _protected_view, (), {})
    except DisallowedHost:
        return errors.BAD_HOST
    if reason is None:
        return None
    return errors.CSRF_FAILED.with_message(f"{errors.CSRF_FAILED.message} ({reason})")


def preflight_error(scope: Any) -> tuple[errors.ApiError, list[tuple[bytes, bytes]]] | None:
    """What a chat stream request is refused for before its body matters: the method, the
    content type and the host. Checked once, by the router, so both paths answer alike."""
    if scope["method"] != "POST":
        return errors.METHOD_NOT_ALLOWED, [(b"allow", b"POST")]
    if not is_json(header(scope, b"content-type")):
        return errors.UNSUPPORTED_MEDIA_TYPE, []
    if not host_allowed(scope):
        return errors.BAD_HOST, []
    if declared_length(scope) > conf.settings.CHATSITE_STREAM["MAX_BODY_BYTES"]:
        return errors.BODY_TOO_LARGE, []
    return None


def declared_length(scope: Any) -> int:
    """The request's Content-Length (0 when it has none: a chunked body is counted as read)."""
    value = header(scope, b"content-length")
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def host_allowed(scope: Any) -> bool:
    """``HttpRequest.get_host()``'s verdict, without building a request: the Host header (or
    X-Forwarded-Host where trusted) against ALLOWED_HOSTS, with DEBUG's local defaults."""
    host = header_host(scope)
    if host is None:
        server = scope.get("server") or ("", None)
        host = f"{server[0]}:{server[1]}" if server[1] else str(server[0])
    return allowed_host(host)


def header_host(scope: Any) -> str | None:
    """The host the request names, as ``get_host()`` reads it before checking it: its
    X-Forwarded-Host where trusted (``USE_X_FORWARDED_HOST``), else its Host; None when it has
    neither (Django then makes one up from the server's address)."""
    meta = scope_meta(scope)
    host = meta.get("HTTP_X_FORWARDED_HOST") if conf.settings.USE_X_FORWARDED_HOST else None
    return meta.get("HTTP_HOST") if host is None else host


@functools.lru_cache(maxsize=64)
def allowed_host(host: str) -> bool:
    """Whether ``get_host()`` returns ``host`` (else it raises ``DisallowedHost``): its domain
    against ALLOWED_HOSTS, with DEBUG's local defaults. Remembered for the last 64 hosts asked
    about: a site is asked for under a few names, and each costs some 13 µs to check."""
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def header(scope: Any, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def session_key(cookies: Mapping[str, str]) -> str | None:
    """The session cookie of a request's ``cookies`` (``request.COOKIES``)."""
    return cookies.get(conf.settings.SESSION_COOKIE_NAME) or None


def class_hint(cookies: Mapping[str, str]) -> str | None:
    """The class cookie: which class the student is in, as a guess (``services/classrooms``)."""
    return cookies.get(CLASS_COOKIE) or None


def is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "application/json"


def refusal(error: errors.ApiError) -> errors.ApiError:
    """Count ``error`` as a refused request (``ai_rejections_total{reason}``), and return it:
    every JSON error the chat API answers goes through here (a 500 is a failure, not counted)."""
    if error.status != 500:
        metrics.REJECTIONS.labels(reason=error.code).inc()
    return error


@functools.cache
def _page_security_headers() -> tuple[tuple[bytes, bytes], ...]:
    """What Django's middleware adds to every page (SecurityMiddleware, the CSP middleware,
    XFrameOptionsMiddleware), from the same settings, for responses sent past that middleware.
    Strict-Transport-Security depends on the request: ``security_headers``."""
    headers: list[tuple[str, str]] = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append(("x-content-type-options", "nosniff"))
    policy = settings.SECURE_REFERRER_POLICY
    if policy:
        values = policy.split(",") if isinstance(policy, str) else policy
        headers.append(("referrer-policy", ",".join(v.strip() for v in values)))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append(("cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY))
    for header, config in [
        (CSP.HEADER_ENFORCE, settings.SECURE_CSP),
        (CSP.HEADER_REPORT_ONLY, settings.SECURE_CSP_REPORT_ONLY),
    ]:
        if config:
            headers.append((str(header).lower(), build_policy(config)))
    if settings.X_FRAME_OPTIONS:
        headers.append(("x-frame-options", settings.X_FRAME_OPTIONS.upper()))
    return tuple((name.encode("ascii"), value.encode("latin-1")) for name, value in headers)


@functools.cache
def _hsts_header() -> tuple[bytes, bytes] | None:
    seconds = settings.SECURE_HSTS_SECONDS
    if not seconds:
        return None
    value = f"max-age={seconds}"
    if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
        value += "; includeSubDomains"
    if settings.SECURE_HSTS_PRELOAD:
        value += "; preload"
    return b"strict-transport-security", value.encode("ascii")


def _forget_headers(**kwargs: Any) -> None:
    _page_security_headers.cache_clear()
    _hsts_header.cache_clear()
    allowed_host.cache_clear()


setting_changed.connect(_forget_headers)


def scope_secure(scope: Any) -> bool:
    """``HttpRequest.is_secure()`` of an ASGI scope (SECURE_PROXY_SSL_HEADER where set)."""
    proxy_header = conf.settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        meta_name, secure_value = proxy_header
        name = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")
        value = header(scope, name)
        if value is not None:
            return value.split(",", 1)[0].strip() == secure_value
    return scope.get("scheme") == "https"


def security_headers(scope: Any) -> Headers:
    """The security headers of every response, whichever layer sends it: the same as Django's
    pages carry (HSTS only over HTTPS, as there)."""
    headers = list(_page_security_headers())
    hsts = _hsts_header()
    if hsts is not None and scope_secure(scope):
        headers.append(hsts)
    return headers


def json_headers(extra: Headers | None = None) -> Headers:
    """A JSON API response's own headers (Django's middleware adds the security headers)."""
    return [(b"content-type", b"application/json"), (b"cache-control", b"no-store"), *(extra or [])]


def json_error(
    error: errors.ApiError, extra: Headers | None = None, **fields: Any
) -> tuple[int, Headers, bytes]:
    """Every JSON error the site answers, whichever layer sends it: counted as a refusal
    (``refusal``), with its status, its headers (before the security headers) and its body
    (the catalogue's payload, plus ``fields`` beside ``error`` where given)."""
    refusal(error)
    body = error.body() if not fields else json.dumps({**error.payload(), **fields}).encode()
    return error.status, json_headers(extra), body


def raw_error_response(error: errors.ApiError, scope: Any) -> bytes:
    """``error`` as a whole HTTP/1.1 response that closes its connection, for a server layer to
    write straight to the socket (a request refused before the application sees it)."""
    _status, headers, body = json_error(error)
    head = [
        (b"content-length", str(len(body)).encode("ascii")),
        (b"connection", b"close"),
        *headers,
        *security_headers(scope),
    ]
    status_line = f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}".encode("ascii")
    lines = [status_line, *(name + b": " + value for name, value in head)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def api_error(error: errors.ApiError, extra: Headers | None = None, **fields: Any) -> HttpResponse:
    """``json_error`` as a Django response (its middleware adds the security headers)."""
    status, headers, body = json_error(error, extra, **fields)
    response = HttpResponse(body, status=status)
    for name, value in headers:
        response.headers[name.decode("ascii")] = value.decode("latin-1")
    return response


async def send_error(
    send: Callable[[dict[str, Any]], Awaitable[None]],
    scope: Any,
    error: errors.ApiError,
    extra: Headers | None = None,
) -> None:
    """``json_error`` as a whole response on a bare ASGI ``send`` (the router, the consumer)."""
    status, headers, body = json_error(error, extra)
    await send_json(send, scope, status, body, headers)


async def send_json(
    send: Callable[[dict[str, Any]], Awaitable[None]],
    scope: Any,
    status: int,
    body: bytes,
    headers: Headers,
) -> None:
    """A whole JSON response with ``headers`` and the security headers on a bare ASGI ``send``."""
    headers = [*headers, *security_headers(scope)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def sse_headers(request_id: str) -> Headers:
    """A chat stream's own headers, the same on every serving path (with the security headers
    from Django's middleware on the ``django`` path, from ``security_headers`` elsewhere)."""
    # No Content-Length (the body is open-ended), no Content-Encoding (compression buffers), and
    # no hand-set Transfer-Encoding: the server chooses chunking for HTTP/1.1 clients itself.
    return [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache, no-transform"),
        (b"x-accel-buffering", b"no"),
        (b"x-request-id", request_id.encode("ascii")),
    ]
