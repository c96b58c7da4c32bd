"""Pages and the history API (read, rename, delete). The stream itself is
``assistant.consumers``."""

import asyncio
import json
import uuid

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import render
from django.utils.translation import get_language
from django.views.decorators.csrf import csrf_exempt, ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_POST
from django_prometheus import exports

from assistant import errors, http, selectors
from assistant.busy import busy_page
from assistant.class_views import class_cookie_set
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.forms import login_answer
from assistant.page_strings import chat_strings, model_language_notice
from assistant.services.beacons import Beacon, beacon_apply, beacon_parse
from assistant.services.classrooms import session_class
from assistant.services.clients import request_client
from assistant.services.conversations import (
    ConversationNotFound,
    conversation_delete,
    conversation_rename,
    conversation_title_parse,
)
from assistant.services.identity import owner_key_for, session_issue, session_live
from assistant.services.ratelimit import rate_limit_hit
from assistant.services.telemetry import ends_flush

#: How long a beacon waits for its stream's record (stored as the stream ends).
BEACON_WAIT_S = 3.0


def _owner_key(request: HttpRequest) -> str | None:
    """Whose request this is; None for a visitor without a session (only the page issues one)."""
    if not request.user.is_authenticated and not session_live(request.session):
        return None
    return owner_key_for(request.user, request.session.session_key)


@require_GET
@ensure_csrf_cookie
def chat_page(request: HttpRequest) -> HttpResponse:
    """The chat page. Also hands out the CSRF cookie and the session the stream needs, a limited
    number of new ones per address and minute (429 beyond, with a page that tries again)."""
    try:
        session_issue(request.session, client=request_client(request))
    except Rejected as refused:
        return busy_page(request, refused)
    config = settings.CHATSITE_STREAM
    classroom = session_class(request.session)
    context = {
        "ping_interval_ms": int(config["PING_INTERVAL"] * 1000),
        "max_message_chars": config["MAX_MESSAGE_CHARS"],
        "page_strings": chat_strings(),
        "model_language_notice": model_language_notice(get_language()),
        "classroom": classroom,
    }
    response = render(request, "assistant/chat.html", context)
    class_cookie_set(response, None if classroom is None else classroom.id)
    return response


@require_POST
def session_renew(request: HttpRequest) -> HttpResponse:
    """``POST /api/session``: a new session for a page whose session expired (the stream said
    ``session_required``); 204, or 429 ``new_sessions_limited`` with Retry-After."""
    try:
        session_issue(request.session, client=request_client(request))
    except Rejected as refused:
        return http.api_error(refused.error, refused.headers())
    return HttpResponse(status=204)


@require_GET
def conversations(request: HttpRequest) -> JsonResponse:
    """The owner's conversations in the class they are in now (or in none)."""
    owner_key = _owner_key(request)
    if owner_key is None:
        return JsonResponse({"conversations": []})
    classroom = session_class(request.session)
    items = selectors.conversation_list(
        owner_key=owner_key, classroom_id=None if classroom is None else classroom.id
    )
    return JsonResponse({"conversations": items})


def conversation_detail(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """``/api/conversations/<id>``, its owner's only: ``GET`` its messages; ``PATCH``
    ``{"title": "..."}`` renames it (200 ``{"id", "title"}``); ``DELETE`` deletes it and its
    messages (204). Anybody else's, a visitor without a session and an unknown id all get the
    same 404 ``conversation_not_found``. CSRF is checked by the middleware."""
    action = _CONVERSATION_ACTIONS.get(request.method or "")
    if action is None:
        return http.api_error(errors.CONVERSATION_METHOD_NOT_ALLOWED, [(b"allow", _ALLOW)])
    owner_key = _owner_key(request)
    try:
        if owner_key is None:
            raise ConversationNotFound(str(conversation_id))
        return action(request, owner_key, conversation_id)
    except ConversationNotFound:
        return http.api_error(errors.CONVERSATION_NOT_FOUND)
    except Rejected as refused:
        return http.api_error(refused.error, refused.headers())


def _conversation_read(
    request: HttpRequest, owner_key: str, conversation_id: uuid.UUID
) -> HttpResponse:
    messages = selectors.conversation_messages(owner_key=owner_key, conversation_id=conversation_id)
    if messages is None:
        raise ConversationNotFound(str(conversation_id))
    return JsonResponse({"id": str(conversation_id), "messages": messages})


def _conversation_rename(
    request: HttpRequest, owner_key: str, conversation_id: uuid.UUID
) -> HttpResponse:
    if not http.is_json(request.headers.get("content-type")):
        return http.api_error(errors.UNSUPPORTED_MEDIA_TYPE)
    if len(request.body) > settings.CHATSITE_STREAM["MAX_BODY_BYTES"]:
        return http.api_error(errors.BODY_TOO_LARGE)
    title = conversation_title_parse(request.body)
    conversation_rename(owner_key=owner_key, conversation_id=conversation_id, title=title)
    return JsonResponse({"id": str(conversation_id), "title": title})


def _conversation_delete(
    request: HttpRequest, owner_key: str, conversation_id: uuid.UUID
) -> HttpResponse:
    conversation_delete(owner_key=owner_key, conversation_id=conversation_id)
    return HttpResponse(status=204)


_CONVERSATION_ACTIONS = {
    "GET": _conversation_read,
    "PATCH": _conversation_rename,
    "DELETE": _conversation_delete,
}
_ALLOW = ", ".join(_CONVERSATION_ACTIONS).encode("ascii")


def _beacon_sync(
    request: HttpRequest, beacon: Beacon, *, first_try: bool
) -> tuple[object, int | None]:
    owner_key = _owner_key(request)
    if owner_key is None:
        raise Rejected(errors.SESSION_REQUIRED)
    if first_try:
        limit, window = settings.CHATSITE_RATE_LIMITS["beacon"]
        retry_after = rate_limit_hit(scope="beacon", key=owner_key, limit=limit, window_s=window)
        if retry_after is not None:
            return None, retry_after
    return beacon_apply(owner_key=owner_key, beacon=beacon), None


@csrf_exempt  # checked below with the token from the body: sendBeacon cannot set headers
@require_POST
async def beacon(request: HttpRequest) -> HttpResponse:
    """``POST /api/chat/beacon``: the browser's timings of one request. 204 when joined."""
    if len(request.body) > 4096:
        return http.api_error(errors.BODY_TOO_LARGE)
    try:
        payload = json.loads(request.body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return http.api_error(errors.INVALID_JSON)
    if isinstance(payload, dict) and isinstance(payload.get("csrf_token"), str):
        request.META["HTTP_X_CSRFTOKEN"] = payload["csrf_token"]
    rejected = http.csrf_error(request)
    if rejected is not None:
        return http.api_error(rejected)
    try:
        parsed = beacon_parse(payload)
        deadline = asyncio.get_running_loop().time() + BEACON_WAIT_S
        first_try = True
        while True:
            record, retry_after = await run_db(_beacon_sync, request, parsed, first_try=first_try)
            first_try = False
            if retry_after is not None:
                return http.api_error(
                    errors.RATE_LIMITED, [(b"retry-after", str(retry_after).encode())]
                )
            if record is not None:
                return HttpResponse(status=204)
            if asyncio.get_running_loop().time() >= deadline:
                return http.api_error(errors.BEACON_UNKNOWN)
            await asyncio.sleep(0.05)
    except Rejected as exc:
        return http.api_error(exc.error)


def admin_login(request: HttpRequest) -> HttpResponseBase:
    """The admin's login page (``/admin/login/``, also the dashboard's), answering a locked-out
    attempt with 429 and Retry-After beside the form's message (``forms.py``)."""
    return login_answer(admin.site.login(request))


async def metrics_export(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: django_prometheus's exposition, with this worker's ended answers that
    wait to be observed together (``telemetry.stream_observe``) counted first, so a scrape
    sees every answer this worker has ended. Flushed here, on the event loop where they wait;
    the exposition reads the metric files on a thread, as Django runs the view it wraps."""
    ends_flush()
    return await sync_to_async(exports.ExportToDjangoView)(request)
