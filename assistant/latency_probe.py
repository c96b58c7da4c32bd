"""``GET /api/chat/stream/probe``: an event stream on a known schedule, for ``manage.py
ttft_doctor``. Raw ASGI beside the chat stream (the same nginx location family, the same
server), so that what holds the probe's frames back would hold a student's tokens back too.

No model, no session written, no record: staff (by their session) or a bearer API key only,
each key's probes counted against its rate, and at most ``MAX_RUNNING`` probes at once per
process. The schedule and frames are ``services/latency_probe.py``'s.
"""

import asyncio
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest

from assistant import errors, http
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.i18n import scope_translation
from assistant.routing import session_cookie
from assistant.services.api_keys import key_admitted, key_presented
from assistant.services.chat_request import request_id_choose
from assistant.services.frames import ping_interval
from assistant.services.latency_probe import (
    ProbeSchedule,
    done_frame,
    hello_frame,
    probe_frame,
    schedule_parse,
)
from assistant.services.teaching import is_admin

#: Probes running at once in this process; more get 503 ``probe_busy``.
MAX_RUNNING = 16
_running = 0


def _staff_session(session_key: str) -> bool:
    """Synchronous (session store, ORM): whether the session is an active staff member's."""
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return is_admin(get_user(request))


async def probe_allowed(scope: Any, request_id: str) -> None:
    """Raise ``Rejected`` unless the request is staff's or carries a valid key within its
    rate: 401 without either, 403 for a session that is not staff."""
    authorization = http.header(scope, b"authorization")
    if authorization is not None:
        presented = key_presented(authorization)
        await run_db(key_admitted, presented, request_id)
        return
    session_key = session_cookie(scope)
    if session_key is None:
        raise Rejected(errors.PROBE_LOGIN)
    if not await run_db(_staff_session, session_key):
        raise Rejected(errors.PROBE_FORBIDDEN)


async def _frames(send: Any, schedule: ProbeSchedule, hello: bytes) -> None:
    async def frame(body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})

    await frame(hello)
    for seq in range(1, schedule.frames + 1):
        idle = seq == 1 and schedule.idle_s > 0
        await asyncio.sleep(schedule.idle_s if idle else schedule.interval_ms / 1000)
        await frame(probe_frame(seq))
    await send({"type": "http.response.body", "body": done_frame(schedule.frames + 1)})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def latency_probe(scope: Any, receive: Any, send: Any) -> None:
    """The probe: refusals as the site's JSON errors, else the schedule's frames."""
    with scope_translation(scope):
        await _probe(scope, receive, send)


async def _probe(scope: Any, receive: Any, send: Any) -> None:
    global _running
    if scope["method"] != "GET":
        await http.send_error(send, scope, errors.PROBE_METHOD, [(b"allow", b"GET")])
        return
    if not http.host_allowed(scope):
        await http.send_error(send, scope, errors.BAD_HOST)
        return
    request_id = request_id_choose(http.header(scope, b"x-request-id"))
    try:
        schedule = schedule_parse(scope.get("query_string", b""))
        await probe_allowed(scope, request_id)
        if _running >= MAX_RUNNING:
            raise Rejected(errors.PROBE_BUSY, retry_after=5)
    except Rejected as rejected:
        await http.send_error(send, scope, rejected.error, rejected.headers())
        return
    headers = http.sse_headers(request_id)
    if not schedule.accel:
        headers = [header for header in headers if header[0] != b"x-accel-buffering"]
    hello = hello_frame(
        http_version=scope.get("http_version", "1.1"),
        connection=http.header(scope, b"connection"),
        accept_encoding=http.header(scope, b"accept-encoding"),
        ping_s=ping_interval(),
    )
    _running += 1
    try:
        status = {"type": "http.response.start", "status": 200}
        await send({**status, "headers": [*headers, *http.security_headers(scope)]})
        sender = asyncio.ensure_future(_frames(send, schedule, hello))
        listener = asyncio.ensure_future(_disconnected(receive))
        _done, pending = await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
    finally:
        _running -= 1
