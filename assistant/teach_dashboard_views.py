"""What a teacher watches: the live figures of their classes (``/teach/dashboard/`` and its JSON,
``/teach/api/figures``), a class's recent questions where its policy allows, and its records as
CSV. The A/B split and the breaker stay on the staff dashboard (``dashboard_views.py``).

Pages go through ``teach_views.teacher_view`` (login page, 403, 404 for another's class); the
JSON API answers the same refusals as JSON: 401 ``login_required``, 403 ``teachers_only``.
"""

import logging
from collections.abc import AsyncIterator, Callable
from functools import wraps
from typing import Any

from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from assistant import errors, http
from assistant.db import run_db_bulk
from assistant.errors import Rejected
from assistant.models import Classroom
from assistant.services.class_export import After, class_csv_header, class_csv_page
from assistant.services.class_figures import class_figures, class_questions
from assistant.services.dashboard import WINDOWS, window_chosen
from assistant.services.teaching import classes_visible, is_teacher
from assistant.teach_views import teacher_view

logger = logging.getLogger(__name__)

#: The last line of an export that failed part way (a spreadsheet shows it as the last row).
CSV_CUT_SHORT = "# export incomplete: the server failed part way; download it again\r\n"
#: How often the page asks for new figures (the live counts are at most ~2 s old anyway).
REFRESH_MS = 3000


#: The window shown unless the teacher picks another.
DEFAULT_WINDOW = "1h"


def teacher_api(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """The teacher pages' access rule, answered as JSON."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return http.api_error(errors.LOGIN_REQUIRED)
        if not is_teacher(request.user):
            return http.api_error(errors.TEACHERS_ONLY)
        return view(request, *args, **kwargs)

    return wrapper


def figures_payload(user: Any, window: str) -> dict[str, Any]:
    """Synchronous (ORM): every class ``user`` may see, with its figures over ``window``."""
    classes = list(classes_visible(user).order_by("name"))
    figures = class_figures([c.id for c in classes], window_s=WINDOWS[window])
    return {
        "window": window,
        "generated_at": timezone.now().isoformat(),
        "classes": [
            {
                "id": str(c.id),
                "name": c.name,
                "paused": c.paused,
                "teachers_read": c.teachers_read,
                **figures[str(c.id)],
            }
            for c in classes
        ],
    }


@require_GET
@teacher_api
def teach_figures(request: HttpRequest) -> HttpResponse:
    """``GET /teach/api/figures?window=5m|1h|24h``: the teacher's classes and their figures."""
    try:
        window = window_chosen(request.GET.get("window"), DEFAULT_WINDOW)
    except Rejected as refused:
        return http.api_error(refused.error)
    return JsonResponse(figures_payload(request.user, window))


@require_GET
@teacher_view
def teach_dashboard(request: HttpRequest) -> HttpResponse:
    """``GET /teach/dashboard/``: the figures of the teacher's classes, refreshed live."""
    window = request.GET.get("window")
    window = window if window in WINDOWS else DEFAULT_WINDOW
    context = {
        "payload": figures_payload(request.user, window),
        "window": window,
        "windows": list(WINDOWS),
        "refresh_ms": REFRESH_MS,
    }
    return render(request, "assistant/teach/dashboard.html", context)


@require_GET
@teacher_view
def class_questions_page(request: HttpRequest, classroom: Classroom) -> HttpResponse:
    """``GET /teach/<id>/questions``: the class's recent questions and answers, where the class
    lets its teachers read them; else the page says they cannot."""
    context = {"classroom": classroom, "questions": class_questions(classroom)}
    return render(request, "assistant/teach/questions.html", context)


@require_GET
@teacher_view
def class_records_csv(request: HttpRequest, classroom: Classroom) -> HttpResponseBase:
    """``GET /teach/<id>/records.csv``: every record of the class (``class_export.py``) in
    UTF-8 with a byte order mark, so spreadsheets open Chinese nicknames and text as such;
    streamed a page of records at a time, each read on a database thread."""
    response = StreamingHttpResponse(_csv_stream(classroom), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    name = f"class-{classroom.join_code}-{stamp}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


async def _csv_stream(classroom: Classroom) -> AsyncIterator[bytes]:
    """The file, a page of records at a time. A failure after the first bytes cannot become an
    error status any more: it is logged, and the file ends with a line saying it is cut short
    (the server must not see the exception: the response has started)."""
    yield ("\ufeff" + class_csv_header(classroom)).encode("utf-8")
    names: dict[str, str] = {}
    after: After = None
    while True:
        try:
            lines, after = await run_db_bulk(class_csv_page, classroom, after=after, names=names)
        except Exception:
            logger.exception("The CSV export of class %s failed part way", classroom.id)
            yield CSV_CUT_SHORT.encode("utf-8")
            return
        if lines:
            yield lines.encode("utf-8")
        if after is None:
            return
