"""Students joining a class with its code (``/c/`` and ``/c/<code>``) and leaving it. No
account: the class is held by the student's session (``services/classrooms.py``)."""

import uuid

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from assistant.busy import busy_page
from assistant.errors import Rejected
from assistant.services.classrooms import (
    CLASS_COOKIE,
    class_by_code,
    class_join,
    class_leave,
    nickname_parse,
)
from assistant.services.clients import request_client
from assistant.services.identity import owner_key_for, session_issue


def class_cookie_set(response: HttpResponse, classroom_id: uuid.UUID | None) -> None:
    """Keep the class cookie (the early engine start's guess) in step with the session."""
    if classroom_id is None:
        response.delete_cookie(CLASS_COOKIE, samesite="Lax")
        return
    response.set_cookie(
        CLASS_COOKIE,
        str(classroom_id),
        max_age=settings.SESSION_COOKIE_AGE,
        secure=settings.SESSION_COOKIE_SECURE,
        httponly=True,
        samesite="Lax",
    )


@require_http_methods(["GET", "POST"])
def class_join_page(request: HttpRequest, code: str = "") -> HttpResponse:
    """``GET /c/<code>``: the class the code opens, what its teacher can see, and a nickname
    field; ``GET /c/``: a field for the code. ``POST``: join, then the chat page. A code that
    opens no class is answered 404 (410 when it expired), with the field to try another."""
    try:
        session_issue(request.session, client=request_client(request))
    except Rejected as refused:
        return busy_page(request, refused)
    typed = request.POST.get("code", code) if request.method == "POST" else code
    context: dict[str, object] = {"code": typed, "nickname": request.POST.get("nickname", "")}
    if not typed:
        return render(request, "assistant/join.html", context)
    try:
        classroom = class_by_code(typed, client=request_client(request))
        context["classroom"] = classroom
        if request.method == "POST":
            nickname = nickname_parse(request.POST.get("nickname"))
            with transaction.atomic():
                class_join(
                    request.session,
                    owner_key=owner_key_for(request.user, request.session.session_key),
                    classroom=classroom,
                    nickname=nickname,
                )
            response = HttpResponseRedirect("/")
            class_cookie_set(response, classroom.id)
            return response
    except Rejected as refused:
        if refused.retry_after is not None:
            return busy_page(request, refused)
        context["error"] = refused.error.message
        status = refused.error.status
        return render(request, "assistant/join.html", context, status=status)
    return render(request, "assistant/join.html", context)


@require_POST
def class_leave_view(request: HttpRequest) -> HttpResponse:
    """``POST /c/leave``: out of the class, back to the chat page without one."""
    if request.session.session_key is not None:
        class_leave(
            request.session,
            owner_key=owner_key_for(request.user, request.session.session_key),
        )
    response = HttpResponseRedirect("/")
    class_cookie_set(response, None)
    return response
