"""The ``django`` serving path: the chat stream as an async Django view, and resume and Stop.

The same answer runner as the Channels consumer (``assistant.consumers``), behind Django's full
middleware stack (sessions, authentication, CSRF), answered with a ``StreamingHttpResponse`` over
the answer's ``listen()``, so each frame is sent the moment it exists (Daphne would read a sync
iterator to the end first). Django cancels a streaming response on a disconnect, so here the
answer runs in a task of its own (``Answer.run_apart``). Only the transport differs: same bytes,
same records, same timings.
"""

import json
import logging
from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from assistant import errors, http
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.selectors import answer_saved
from assistant.services.answer_registry import answer_find, answer_stop
from assistant.services.answer_start import answer_start
from assistant.services.chat_request import request_id_choose, request_id_valid
from assistant.services.clients import scope_client
from assistant.services.identity import owner_key_for
from assistant.services.timings import StreamTimings, received_at
from assistant.transport import scope_connection

SERVING_PATH = "django"

logger = logging.getLogger(__name__)


async def chat_stream(request: HttpRequest) -> HttpResponseBase:
    """``POST /api/chat/stream/django``: answer one chat message as Server-Sent Events."""
    # Method, content type, host and body size were checked by the router (assistant.routing),
    # CSRF by the middleware.
    scope = request.scope  # type: ignore[attr-defined]
    timings = StreamTimings(received=received_at(scope))
    request_id = request_id_choose(request.headers.get("x-request-id"))
    try:
        answer = await answer_start(
            body=request.body,
            session_key=http.session_key(request.COOKIES),
            class_hint=http.class_hint(request.COOKIES),
            client=scope_client(scope),
            request_id=request_id,
            serving_path=SERVING_PATH,
            timings=timings,
        )
    except Rejected as rejected:
        return http.api_error(rejected.error, rejected.headers())
    except Exception:
        logger.exception("Chat stream crashed before it started")
        return http.api_error(errors.SERVER_FAILED)
    answer.run_apart(connection=scope_connection(scope))
    return event_stream(answer.listen(0, asker=True), request_id)


def event_stream(body: AsyncIterator[bytes], request_id: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, status=200)
    for name, value in http.sse_headers(request_id):
        response.headers[name.decode("ascii")] = value.decode("latin-1")
    return response


async def _existing_owner(request: HttpRequest) -> str | None:
    """Whose request this is, without creating a session: None for a visitor with neither."""
    session_key = request.session.session_key
    user = await request.auser()
    if session_key is None and not user.is_authenticated:
        return None
    return owner_key_for(user, session_key)


async def chat_resume(request: HttpRequest) -> HttpResponseBase:
    """``POST /api/chat/resume`` ``{"request_id": "..."}`` with ``Last-Event-ID: n``: the rest of
    an answer whose stream broke, from token n + 1 (see ``services/answer_buffer.py``)."""
    if request.method != "POST":
        return http.api_error(errors.METHOD_NOT_ALLOWED, [(b"allow", b"POST")])
    try:
        payload = json.loads(request.body)
        request_id = payload["request_id"]
        last_id = int(request.headers.get("last-event-id") or 0)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
        return http.api_error(errors.RESUME_INVALID)
    if not request_id_valid(request_id) or last_id < 0:
        return http.api_error(errors.RESUME_INVALID)
    owner_key = await _existing_owner(request)
    if owner_key is None:
        return http.api_error(errors.STREAM_EXPIRED)
    answer = answer_find(request_id=request_id, owner_key=owner_key)
    if answer is None:
        saved = await run_db(answer_saved, owner_key=owner_key, request_id=request_id)
        return http.api_error(errors.STREAM_EXPIRED, answer=saved)
    return event_stream(answer.listen(last_id), request_id)


async def chat_stop(request: HttpRequest) -> HttpResponseBase:
    """``POST /api/chat/stop`` ``{"request_id": "..."}``: the student pressed Stop. The answer
    ends now, listened to or not, and what was said of it is stored; 204, or 404 when no answer
    of this session's with that id runs in this process (it may just have ended)."""
    if request.method != "POST":
        return http.api_error(errors.METHOD_NOT_ALLOWED, [(b"allow", b"POST")])
    try:
        request_id = json.loads(request.body)["request_id"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
        return http.api_error(errors.STOP_INVALID)
    if not request_id_valid(request_id):
        return http.api_error(errors.STOP_INVALID)
    owner_key = await _existing_owner(request)
    if owner_key is None or not answer_stop(owner_key=owner_key, request_id=request_id):
        return http.api_error(errors.STOP_UNKNOWN)
    return HttpResponse(status=204)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponseBase:
    """CSRF failures: JSON for the APIs (as the direct path answers), Django's page elsewhere."""
    if request.path.startswith(("/api/", "/dashboard/api/")):
        error = errors.CSRF_FAILED
        return http.api_error(error.with_message(f"{error.message} ({reason})"))
    from django.views.csrf import csrf_failure as page

    return page(request, reason=reason)
