"""The chat stream's CSRF check, without a Django request for the questions that pass it.

The ``direct`` path's consumer runs outside Django's middleware and checks CSRF itself: Django's
``CsrfViewMiddleware`` on an ``ASGIRequest`` (``http.csrf_error``). Building that request and
running the middleware's checks costs about 115 µs of CPU per question, on the way to the first
token, for a verdict that is nearly always the same: the page asks from its own origin, with a
JSON body and the ``csrftoken`` cookie's secret in ``X-CSRFToken``.

``csrf_passes`` recognises that request from the ASGI scope, by Django's own rules and settings,
and says True only where Django's check passes the same request. Anything else (an Origin other
than the site's own, HTTPS without an Origin, a form's token, ``CSRF_USE_SESSIONS``, a token
missing, malformed or wrong) is False, and the caller runs Django's check, which gives the
refusal and its reason: every refusal stays Django's. ``tests/assistant/test_csrf.py`` runs the
two side by side on a range of requests. The headers and cookies are read as Django reads them
(``scope_headers``).
"""

import hmac
from collections.abc import MutableMapping
from typing import Any

from django.middleware.csrf import (
    CSRF_ALLOWED_CHARS,
    CSRF_SECRET_LENGTH,
    CSRF_TOKEN_LENGTH,
)

from assistant import conf, errors, http
from assistant.scope_headers import scope_cookies, scope_meta

#: Each character of a token and its place in ``CSRF_ALLOWED_CHARS`` (a masked token's key).
_PLACE = {char: place for place, char in enumerate(CSRF_ALLOWED_CHARS)}


def csrf_passes(scope: MutableMapping[str, Any]) -> bool:
    """True when Django's CSRF check (``http.csrf_error``) passes this POST with a JSON body to
    a view it protects; False when it may not (the caller then asks it)."""
    meta = scope_meta(scope)
    if conf.settings.CSRF_USE_SESSIONS or not http.is_json(meta.get("CONTENT_TYPE")):
        return False  # the secret is in the session, or a form's body may hold the token
    secure = http.scope_secure(scope)
    origin = meta.get("HTTP_ORIGIN")
    if origin is None:
        if secure:
            return False  # HTTPS without an Origin: Django checks the Referer
    else:
        host = http.header_host(scope)
        if host is None or not http.allowed_host(host):
            return False  # Django's get_host() would make one up, or refuse it
        if origin != f"{'https' if secure else 'http'}://{host}":
            return False  # another origin: Django looks at CSRF_TRUSTED_ORIGINS
    secret = _secret(scope_cookies(scope).get(conf.settings.CSRF_COOKIE_NAME))
    token = _secret(meta.get(conf.settings.CSRF_HEADER_NAME))
    return secret is not None and token is not None and hmac.compare_digest(secret, token)


def csrf_refusal(scope: MutableMapping[str, Any], body: bytes) -> errors.ApiError | None:
    """Why the CSRF check refuses this request, or None when it passes: at once for the page's
    own questions (``csrf_passes``), else Django's check on a request built for it."""
    if csrf_passes(scope):
        return None
    return http.csrf_error(http.asgi_request(scope, body))


def _secret(token: str | None) -> str | None:
    """The secret a well-formed token (as the cookie holds it, or masked) carries; None for
    anything else."""
    if token is None or not token.isascii() or not token.isalnum():
        return None
    if len(token) == CSRF_SECRET_LENGTH:
        return token
    if len(token) != CSRF_TOKEN_LENGTH:
        return None
    mask, cipher = token[:CSRF_SECRET_LENGTH], token[CSRF_SECRET_LENGTH:]
    chars, place = CSRF_ALLOWED_CHARS, _PLACE
    return "".join(chars[place[c] - place[m]] for c, m in zip(cipher, mask, strict=True))
