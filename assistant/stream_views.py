"""The ``django`` serving path: the chat stream as an async Django view.

The same service layer as the Channels consumer (``assistant.consumers``), behind Django's full
middleware stack (sessions, authentication, CSRF), answered with a ``StreamingHttpResponse`` over
an async iterator, so each frame is sent the moment it exists (Daphne would read a sync iterator
to the end first). Only the transport differs: same bytes, same records, same timings.
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse

from assistant import errors, http
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.selectors import answer_saved
from assistant.services import background
from assistant.services.chat_request import request_id_choose, request_id_valid
from assistant.services.clients import scope_client
from assistant.services.frames import ping_interval
from assistant.services.identity import owner_key_for
from assistant.services.resume import resumable_find, resumable_open, resumable_stop
from assistant.services.stream_start import chat_stream_start
from assistant.services.streaming import ChatStream, chat_stream_into
from assistant.services.timings import StreamTimings, received_at
from assistant.transport import scope_connection

PATH_NAME = "django"

logger = logging.getLogger(__name__)


def api_error(
    error: errors.ApiError, headers: list[tuple[bytes, bytes]] | None = None
) -> HttpResponse:
    """An ``ApiError`` as the JSON response both serving paths send."""
    http.refusal(error)
    response = HttpResponse(error.body(), status=error.status)
    for name, value in http.json_headers(headers):
        response.headers[name.decode("ascii")] = value.decode("latin-1")
    return response


async def chat_stream(request: HttpRequest) -> HttpResponseBase:
    """``POST /api/chat/stream/django``: answer one chat message as Server-Sent Events."""
    # Method, content type, host and body size were checked by the router (assistant.routing),
    # CSRF by the middleware.
    timings = StreamTimings(received=received_at(request.scope))  # type: ignore[attr-defined]
    body = request.body
    request_id = request_id_choose(request.headers.get("x-request-id"))
    try:
        stream = await chat_stream_start(
            body=body,
            session_key=http.session_key(request),
            client=scope_client(request.scope),  # type: ignore[attr-defined]
            request_id=request_id,
            path=PATH_NAME,
            timings=timings,
            connection=scope_connection(request.scope),  # type: ignore[attr-defined]
        )
    except Rejected as rejected:
        return api_error(rejected.error, rejected.headers())
    except Exception:
        logger.exception("Chat stream crashed before it started")
        return api_error(errors.SERVER_FAILED)
    # The answer runs on its own task into its buffer; this response is its first listener,
    # and a page that lost it can resume from the buffer (chat_resume). The task stops the
    # answer and stores it whatever happens to the response.
    resumable = resumable_open(
        request_id=request_id,
        owner_key=stream.identity.owner_key,
        stop=lambda: None,
        contended=stream.engine.contended,
    )
    if stream.connection is not None:
        # The answer writes into the buffer: frames waiting there are unread by the client too,
        # so a reader that stalls is noticed while the answer is still being generated.
        stream.connection = stream.connection.behind(resumable.unread)
    stream.heard_by(resumable)
    answering = asyncio.create_task(chat_stream_into(stream, resumable))
    background.adopt(answering)
    resumable.stop = answering.cancel
    body = _reader_guarded(resumable.listen(0, ping_interval()), stream, answering)
    return event_stream(body, request_id)


async def _reader_guarded(
    frames: AsyncIterator[bytes], stream: ChatStream, answering: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    """The response's frames; a client that leaves too much of them unread is dropped and its
    answer stopped (the answer runs ahead into its buffer, so the check is made here, where
    frames are written to the connection)."""
    limit = settings.CHATSITE_STREAM["MAX_UNSENT_BYTES"]
    async for frame in frames:
        yield frame
        connection = stream.connection
        if connection is not None and connection.unsent() > limit:
            stream.outcome = stream.finish_reason = "slow_client"
            logger.warning("Dropped a client that stopped reading %s", stream.exchange.request_id)
            connection.abort()
            answering.cancel()
            return


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
    an answer whose stream broke, from token n + 1 (see ``services/resume.py``)."""
    if request.method != "POST":
        return api_error(errors.METHOD_NOT_ALLOWED, [(b"allow", b"POST")])
    try:
        payload = json.loads(request.body)
        request_id = payload["request_id"]
        last_id = int(request.headers.get("last-event-id") or 0)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
        return api_error(errors.RESUME_INVALID)
    if not request_id_valid(request_id) or last_id < 0:
        return api_error(errors.RESUME_INVALID)
    owner_key = await _existing_owner(request)
    if owner_key is None:
        return api_error(errors.STREAM_EXPIRED)
    resumable = resumable_find(request_id=request_id, owner_key=owner_key)
    if resumable is None:
        saved = await run_db(answer_saved, owner_key=owner_key, request_id=request_id)
        expired = errors.STREAM_EXPIRED
        payload = {**expired.payload(), "answer": saved}
        return HttpResponse(
            json.dumps(payload), status=expired.status, content_type="application/json"
        )
    return event_stream(resumable.listen(last_id, ping_interval()), request_id)


async def chat_stop(request: HttpRequest) -> HttpResponseBase:
    """``POST /api/chat/stop`` ``{"request_id": "..."}``: the student pressed Stop. The answer
    ends now, listened to or not, and what was said of it is stored; 204, or 404 when no answer
    of this session's with that id runs in this process (it may just have ended)."""
    if request.method != "POST":
        return api_error(errors.METHOD_NOT_ALLOWED, [(b"allow", b"POST")])
    try:
        request_id = json.loads(request.body)["request_id"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
        return api_error(errors.STOP_INVALID)
    if not request_id_valid(request_id):
        return api_error(errors.STOP_INVALID)
    owner_key = await _existing_owner(request)
    if owner_key is None or not resumable_stop(owner_key=owner_key, request_id=request_id):
        return api_error(errors.STOP_UNKNOWN)
    return HttpResponse(status=204)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponseBase:
    """CSRF failures: JSON for the APIs (as the direct path answers), Django's page elsewhere."""
    if request.path.startswith(("/api/", "/dashboard/api/")):
        error = errors.CSRF_FAILED
        return api_error(error.with_message(f"{error.message} ({reason})"))
    from django.views.csrf import csrf_failure as page

    return page(request, reason=reason)
