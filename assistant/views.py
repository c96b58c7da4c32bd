"""Pages and the read-only history API. The stream itself is ``assistant.consumers``."""

import uuid

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_GET

from assistant import errors, selectors
from assistant.services.identity import owner_key_for, session_ensure


def _owner_key(request: HttpRequest) -> str:
    session_ensure(request.session)
    return owner_key_for(request.user, request.session.session_key)


@require_GET
@ensure_csrf_cookie
def chat_page(request: HttpRequest) -> HttpResponse:
    """The chat page. Also hands out the CSRF cookie and the session the stream needs."""
    _owner_key(request)
    config = settings.CHATSITE_STREAM
    context = {
        "ping_interval_ms": int(config["PING_INTERVAL"] * 1000),
        "max_message_chars": config["MAX_MESSAGE_CHARS"],
    }
    return render(request, "assistant/chat.html", context)


@require_GET
def conversations(request: HttpRequest) -> JsonResponse:
    items = selectors.conversation_list(owner_key=_owner_key(request))
    return JsonResponse({"conversations": items})


@require_GET
def conversation_detail(request: HttpRequest, conversation_id: uuid.UUID) -> JsonResponse:
    messages = selectors.conversation_messages(
        owner_key=_owner_key(request), conversation_id=conversation_id
    )
    if messages is None:
        error = errors.CONVERSATION_NOT_FOUND
        return JsonResponse(error.payload(), status=error.status)
    return JsonResponse({"id": str(conversation_id), "messages": messages})
