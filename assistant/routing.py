"""The chat stream's ASGI entry: note the arrival time, then hand over to a serving path.

``/api/chat/stream/direct`` and ``/api/chat/stream/django`` name their path (benchmarks, and
operators who split at the proxy); ``/api/chat/stream`` follows the sticky split. Routing costs a
cookie lookup and a hash: the split itself is in memory (``services.serving``).
"""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.http.cookie import parse_cookie

from assistant import http
from assistant.services.serving import split_current
from assistant.services.timings import RECEIVED_KEY, now
from assistant.transport import CONNECTION_KEY, client_connection

Scope = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]
]

STREAM_PREFIX = "/api/chat/stream"


def session_cookie(scope: Scope) -> str | None:
    """The session key from the request's cookies, parsed as Django parses them."""
    cookies = [
        value.decode("latin-1") for key, value in scope.get("headers", ()) if key == b"cookie"
    ]
    return parse_cookie("; ".join(cookies)).get(settings.SESSION_COOKIE_NAME) or None


class ChatStreamRouter:
    """Dispatch a chat stream to ``apps[path]``, by URL or by the split."""

    def __init__(self, apps: dict[str, ASGIApp]) -> None:
        self.apps = apps

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        scope[RECEIVED_KEY] = now()
        scope[CONNECTION_KEY] = client_connection(send)
        refused = http.preflight_error(scope)
        if refused is not None:
            error, extra = refused
            http.refusal(error)
            headers = http.json_response_headers(extra)
            await send({"type": "http.response.start", "status": error.status, "headers": headers})
            await send({"type": "http.response.body", "body": error.body()})
            return
        named = scope["path"].removeprefix(STREAM_PREFIX).strip("/")
        if named:
            path = named
        else:
            split = await split_current()
            path = split.route(session_cookie(scope))
        await self.apps[path](scope, receive, send)
