"""An ASGI request's headers and cookies as Django's request would have them, read once.

A chat stream on the ``direct`` path runs without a Django request, and three steps before its
first token read its headers: the router (the session cookie, for the split), the language
(``i18n``: the language cookie and Accept-Language) and the consumer's CSRF check (``csrf``).
Each reads them here: worked out once per request and kept in its scope.
"""

from collections.abc import Mapping, MutableMapping
from typing import Any

from django.http.cookie import parse_cookie

#: Where a scope keeps what was worked out of it.
META_KEY = "chatsite.meta"
COOKIES_KEY = "chatsite.cookies"


def scope_meta(scope: MutableMapping[str, Any]) -> Mapping[str, str]:
    """The request's headers as ``ASGIRequest`` puts them in ``META``: ``HTTP_`` and the name in
    capitals (``CONTENT_TYPE`` and ``CONTENT_LENGTH`` without), a name with an underscore left
    out, repeated headers joined with commas, cookies with semicolons."""
    meta: dict[str, str] | None = scope.get(META_KEY)
    if meta is not None:
        return meta
    meta = {}
    cookies: list[str] = []
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1")
        if "_" in name:
            continue
        value = raw_value.decode("latin-1")
        if name == "cookie":
            cookies.append(value.rstrip("; "))
            continue
        if name == "content-type":
            key = "CONTENT_TYPE"
        elif name == "content-length":
            key = "CONTENT_LENGTH"
        else:
            key = "HTTP_" + name.upper().replace("-", "_")
        meta[key] = f"{meta[key]},{value}" if key in meta else value
    if cookies:
        meta["HTTP_COOKIE"] = "; ".join(cookies)
    scope[META_KEY] = meta
    return meta


def scope_cookies(scope: MutableMapping[str, Any]) -> Mapping[str, str]:
    """The request's cookies, as ``request.COOKIES`` has them."""
    cookies: dict[str, str] | None = scope.get(COOKIES_KEY)
    if cookies is None:
        cookies = scope[COOKIES_KEY] = parse_cookie(scope_meta(scope).get("HTTP_COOKIE", ""))
    return cookies
