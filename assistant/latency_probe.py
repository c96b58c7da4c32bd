"""``GET /api/chat/stream/probe``: an event stream on a known schedule, for ``manage.py
ttft_doctor``. Raw ASGI beside the chat stream (the same nginx location family, the same
server), so that what holds the probe's frames back would hold a student's tokens back too.

No model, no session written, no record. Who may run it, and how many at once, is
``services/probe_access.py``'s; the schedule and the frames are ``services/latency_probe.py``'s.
"""

import asyncio
import contextlib
import logging
from typing import Any

from assistant import errors, http
from assistant.errors import Rejected
from assistant.i18n import scope_translation
from assistant.routing import session_cookie
from assistant.services.chat_request import request_id_choose
from assistant.services.frames import ping_interval
from assistant.services.latency_probe import (
    ProbeSchedule,
    done_frame,
    hello_frame,
    probe_frame,
    schedule_parse,
)
from assistant.services.probe_access import SEATS, probe_admit

logger = logging.getLogger(__name__)


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


async def _stream(send: Any, receive: Any, schedule: ProbeSchedule, hello: bytes) -> None:
    """Send the frames until the schedule ends or the client leaves; both tasks are ended and
    awaited whatever happens, this task's own cancellation included."""
    sender = asyncio.create_task(_frames(send, schedule, hello))
    listener = asyncio.create_task(_disconnected(receive))
    try:
        await asyncio.wait({sender, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sender, listener):
            task.cancel()
        await asyncio.gather(sender, listener, return_exceptions=True)
    failure = None if sender.cancelled() else sender.exception()
    if failure is not None:
        logger.error("latency probe failed", exc_info=failure)
        # End the response; the connection that failed may refuse this too.
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b""})


async def latency_probe(scope: Any, receive: Any, send: Any) -> None:
    """The probe: refusals as the site's JSON errors, else the schedule's frames."""
    with scope_translation(scope):
        await _probe(scope, receive, send)


async def _probe(scope: Any, receive: Any, send: Any) -> None:
    if scope["method"] != "GET":
        await http.send_error(send, scope, errors.PROBE_METHOD, [(b"allow", b"GET")])
        return
    if not http.host_allowed(scope):
        await http.send_error(send, scope, errors.BAD_HOST)
        return
    request_id = request_id_choose(http.header(scope, b"x-request-id"))
    try:
        schedule = schedule_parse(scope.get("query_string", b""))
        caller = await probe_admit(
            authorization=http.header(scope, b"authorization"),
            session_key=session_cookie(scope),
            request_id=request_id,
        )
        SEATS.take(caller)
    except Rejected as rejected:
        await http.send_error(send, scope, rejected.error, rejected.headers())
        return
    try:
        headers = http.sse_headers(request_id)
        if not schedule.accel:
            headers = [header for header in headers if header[0] != b"x-accel-buffering"]
        hello = hello_frame(
            http_version=scope.get("http_version", "1.1"),
            connection=http.header(scope, b"connection"),
            accept_encoding=http.header(scope, b"accept-encoding"),
            ping_s=ping_interval(),
        )
        headers += http.security_headers(scope)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _stream(send, receive, schedule, hello)
    finally:
        SEATS.give_back(caller)
