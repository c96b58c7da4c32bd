"""The chat stream's ASGI entry: note the arrival time, then hand over to a serving path.

``/api/chat/stream/direct`` and ``/api/chat/stream/django`` name their path (benchmarks, and
operators who split at the proxy); ``/api/chat/stream`` follows the sticky split. Routing costs a
cookie lookup and a hash: the split itself is in memory (``services.serving``).
"""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from assistant import errors, http
from assistant.i18n import scope_translation
from assistant.scope_headers import scope_cookies
from assistant.services.serving_refresh import split_current
from assistant.services.timings import RECEIVED_KEY, now
from assistant.transport import CONNECTION_KEY, client_connection

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
ASGIApp = Callable[
    [Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]
]

STREAM_PREFIX = "/api/chat/stream"


def session_cookie(scope: Scope) -> str | None:
    """The session key from the request's cookies, parsed as Django parses them."""
    return http.session_key(scope_cookies(scope))


class ChatStreamRouter:
    """Dispatch a chat stream to ``apps[serving_path]``, by URL or by the split."""

    def __init__(self, apps: dict[str, ASGIApp]) -> None:
        self.apps = apps

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        scope[RECEIVED_KEY] = now()
        scope[CONNECTION_KEY] = client_connection(send)
        with scope_translation(scope):
            await self._route(scope, receive, send)

    async def _route(self, scope: Scope, receive: Any, send: Any) -> None:
        refused = http.preflight_error(scope)
        if refused is not None:
            error, extra = refused
            await http.send_error(send, scope, error, extra)
            return
        named = scope["path"].removeprefix(STREAM_PREFIX).strip("/")
        if named:
            serving_path = named
        else:
            split = await split_current()
            serving_path = split.route(session_cookie(scope))
        if serving_path == "django":
            # Django reads a whole body before a view can look at it: read it here, and stop at
            # the limit (the consumer counts as it reads, too).
            try:
                body = await body_read(receive, settings.CHATSITE_STREAM["MAX_BODY_BYTES"])
            except BodyTooLarge:
                await http.send_error(send, scope, errors.BODY_TOO_LARGE)
                return
            if body is None:
                return  # the client left before its body arrived
            receive = body_replayed(body, receive)
        await self.apps[serving_path](scope, receive, send)


class BodyTooLarge(Exception):
    """The request body is longer than the limit."""


async def body_read(receive: Receive, limit: int) -> bytes | None:
    """The request body, read as it arrives; ``BodyTooLarge`` as soon as it passes ``limit``
    bytes, None when the client disconnects first."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def body_replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an application after ``body_read``: the body as one message, then
    whatever the server sends next (the disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed
