"""HTTP helpers for ASGI consumers that run without Django's middleware stack."""

import io
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.http.request import split_domain_port, validate_host
from django.middleware.csrf import CsrfViewMiddleware

from assistant import errors, metrics


class _CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, answering with the reason instead of a 403 page."""

    def _reject(self, request: Any, reason: str) -> str:  # type: ignore[override]
        return reason


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
    return None


def host_allowed(scope: Any) -> bool:
    """``HttpRequest.get_host()``'s verdict, without building a request: the Host header (or
    X-Forwarded-Host where trusted) against ALLOWED_HOSTS, with DEBUG's local defaults."""
    host = None
    if settings.USE_X_FORWARDED_HOST:
        host = header(scope, b"x-forwarded-host")
    if host is None:
        host = header(scope, b"host")
    if host is None:
        server = scope.get("server") or ("", None)
        host = f"{server[0]}:{server[1]}" if server[1] else str(server[0])
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


def session_key(request: ASGIRequest) -> str | None:
    return request.COOKIES.get(settings.SESSION_COOKIE_NAME) or None


def is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "application/json"


def refusal(error: errors.ApiError) -> errors.ApiError:
    """Count ``error`` as a refused request (``ai_rejections_total{reason}``), and return it:
    every JSON error the chat API answers goes through here (a 500 is a failure, not counted)."""
    if error.status != 500:
        metrics.REJECTIONS.labels(reason=error.code).inc()
    return error


def json_response_headers(
    extra: list[tuple[bytes, bytes]] | None = None,
) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
        *(extra or []),
    ]


def sse_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    """The response headers of a chat stream, the same on every serving path."""
    # No Content-Length (the body is open-ended), no Content-Encoding (compression buffers), and
    # no hand-set Transfer-Encoding: the server chooses chunking for HTTP/1.1 clients itself.
    return [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache, no-transform"),
        (b"x-accel-buffering", b"no"),
        (b"x-content-type-options", b"nosniff"),
        (b"x-request-id", request_id.encode("ascii")),
    ]
