"""The teachers' pages (``/teach/``): their login, their classes, and each class's settings,
join code and pause.

Who may do what is decided in one place, ``teacher_view``, which every view here goes through:
a visitor without a login is sent to the teachers' login page (a student's session is not a
login), an account that may not run classes gets 403, and a class the user may not see is 404,
the same as one that does not exist (``services/teaching.py``), for a page and an action alike.
"""

import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse, reverse_lazy
from django.utils.translation import gettext, gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from assistant.forms import login_answer
from assistant.models import Classroom
from assistant.services.classrooms import join_code_rotate
from assistant.services.teaching import (
    class_create,
    class_members,
    class_pause,
    class_settings_change,
    class_visible,
    classes_listed,
    is_teacher,
)
from assistant.teach_forms import (
    PERSONA_EXAMPLES,
    ClassNewForm,
    ClassSettingsForm,
    TeacherAuthenticationForm,
)

type View = Callable[..., HttpResponseBase]

#: ``POST /teach/<id>/pause`` takes ``paused`` as one of these.
PAUSED_VALUES = {"1": True, "0": False}
#: The answer to any other (the page's buttons send only those).
PAUSED_INVALID = gettext_lazy("paused must be 1 or 0.")


class SeeOther(HttpResponseRedirect):
    """After a form's POST: the browser GETs the page (a reload does not post again)."""

    status_code = 303


def teacher_view(view: View) -> View:
    """The access rule of every teacher page and action. A ``classroom_id`` argument is turned
    into ``classroom``: a class the user may see, else 404."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        classroom_id: uuid.UUID | None = kwargs.pop("classroom_id", None)
        if not request.user.is_authenticated:
            return redirect_to_login(
                _after_login(request, classroom_id), login_url=reverse("teach:login")
            )
        if not is_teacher(request.user):
            return render(request, "assistant/teach/forbidden.html", status=403)
        if classroom_id is not None:
            kwargs["classroom"] = class_visible(request.user, classroom_id)
        return view(request, *args, **kwargs)

    return wrapper


def _after_login(request: HttpRequest, classroom_id: uuid.UUID | None) -> str:
    """Where the login page sends the teacher next: this page, or for an action on a class
    (POST only) the class's page, where its button is."""
    if request.method == "GET" or classroom_id is None:
        return request.get_full_path()
    return reverse("teach:class", args=[classroom_id])


def _join_link(request: HttpRequest, classroom: Classroom) -> str:
    """The link a student opens to join (``/c/<code>``), absolute: it is shared outside."""
    return request.build_absolute_uri(reverse("assistant:join-code", args=[classroom.join_code]))


_login = auth_views.LoginView.as_view(
    form_class=TeacherAuthenticationForm,
    template_name="assistant/teach/login.html",
    next_page=reverse_lazy("teach:classes"),
)


@require_http_methods(["GET", "POST"])
def teach_login(request: HttpRequest) -> HttpResponseBase:
    """``/teach/login/``: Django's login for teachers (not staff only, as the admin's is),
    throttled and answering a lockout with 429 as the admin's login does."""
    return login_answer(_login(request))


teach_logout = auth_views.LogoutView.as_view(next_page=reverse_lazy("teach:login"))

password_change = teacher_view(
    auth_views.PasswordChangeView.as_view(
        template_name="assistant/teach/password.html",
        success_url=reverse_lazy("teach:password-done"),
    )
)
password_done = teacher_view(
    auth_views.PasswordChangeDoneView.as_view(template_name="assistant/teach/password_done.html")
)


@require_GET
@teacher_view
def class_list(request: HttpRequest) -> HttpResponse:
    """``/teach/``: the user's classes (every class, for an admin)."""
    classes = list(classes_listed(request.user))
    rows = [(classroom, _join_link(request, classroom)) for classroom in classes]
    return render(request, "assistant/teach/classes.html", {"rows": rows})


@require_http_methods(["GET", "POST"])
@teacher_view
def class_new(request: HttpRequest) -> HttpResponse:
    """``/teach/new``: a new class, run by whoever makes it; then its page."""
    form = ClassNewForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        classroom = class_create(name=form.cleaned_data["name"], teacher=request.user)
        return SeeOther(reverse("teach:class", args=[classroom.id]))
    status = 400 if form.is_bound else 200
    return render(request, "assistant/teach/new.html", {"form": form}, status=status)


@require_http_methods(["GET", "POST"])
@teacher_view
def class_page(request: HttpRequest, classroom: Classroom) -> HttpResponse:
    """``/teach/<id>/``: the class's settings (POST saves them: 400 with the form's errors for
    a value out of bounds), its join code and link, its pause, and who is in it now."""
    if request.method == "POST":
        form = ClassSettingsForm(request.POST)
        if form.is_valid():
            class_settings_change(classroom, **form.changes())
            messages.success(request, gettext("Settings saved."))
            return SeeOther(reverse("teach:class", args=[classroom.id]))
    else:
        form = ClassSettingsForm.of(classroom)
    context = {
        "classroom": classroom,
        "form": form,
        "join_link": _join_link(request, classroom),
        "members": class_members(classroom),
        "persona_examples": PERSONA_EXAMPLES,
    }
    status = 400 if form.is_bound else 200
    return render(request, "assistant/teach/class.html", context, status=status)


@require_POST
@teacher_view
def class_code_rotate(request: HttpRequest, classroom: Classroom) -> HttpResponse:
    """``POST /teach/<id>/code``: a new join code; the old one stops working at once."""
    code = join_code_rotate(classroom)
    messages.success(request, gettext("New join code: %(code)s") % {"code": code})
    return SeeOther(reverse("teach:class", args=[classroom.id]))


@require_POST
@teacher_view
def class_pause_set(request: HttpRequest, classroom: Classroom) -> HttpResponse:
    """``POST /teach/<id>/pause`` with ``paused=1`` (pause) or ``paused=0`` (open again)."""
    paused = PAUSED_VALUES.get(request.POST.get("paused", ""))
    if paused is None:
        return HttpResponse(PAUSED_INVALID, status=400, content_type="text/plain; charset=utf-8")
    class_pause(classroom, paused=paused)
    return SeeOther(reverse("teach:class", args=[classroom.id]))
