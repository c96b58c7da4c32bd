"""``/healthz`` and ``/readyz``: raw ASGI, ahead of Django's middleware.

A probe costs no session, no cookie, no CSRF token and no database row, whatever it sends: it
runs before the session middleware could save anything. Both answer GET and HEAD only.
``/healthz`` is 200 while the process serves; ``/readyz`` is 200 when a question could be
answered now and 503 otherwise, with JSON naming each component's state.
"""

import json
from typing import Any

from assistant import errors, http
from assistant.services.health import readiness_check

PROBE_METHOD = errors.METHOD_NOT_ALLOWED.with_message("Use GET or HEAD.")


async def _respond(
    send: Any,
    scope: Any,
    status: int,
    payload: dict[str, Any],
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = b"" if scope["method"] == "HEAD" else json.dumps(payload).encode()
    await http.send_json(send, scope, status, body, http.json_headers(extra))


async def _refused(scope: Any, send: Any) -> bool:
    if scope["method"] in {"GET", "HEAD"}:
        return False
    allow = [(b"allow", b"GET, HEAD")]
    await _respond(send, scope, PROBE_METHOD.status, PROBE_METHOD.payload(), allow)
    return True


async def healthz(scope: Any, receive: Any, send: Any) -> None:
    """200 while the process serves requests."""
    if not await _refused(scope, send):
        await _respond(send, scope, 200, {"status": "ok"})


async def readyz(scope: Any, receive: Any, send: Any) -> None:
    """200 when the database, the cache and the engines can serve; 503 naming what cannot."""
    if await _refused(scope, send):
        return
    readiness = await readiness_check()
    status = 200 if readiness.ready else 503
    state = "ready" if readiness.ready else "not_ready"
    await _respond(send, scope, status, {"status": state, "checks": readiness.checks})
