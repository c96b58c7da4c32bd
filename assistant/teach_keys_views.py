"""A class's API keys for its teachers (``/teach/<id>/keys``): the list, a new key, a revoke.

Access is ``teach_views.teacher_view``'s, as on every teacher page: no login, the login page; an
account that may not run classes, 403; another teacher's class (or a key of another class), 404.

A new key's text exists only in the response to the POST that made it (``services/api_keys.py``
stores its hash): the page is rendered in that response, not after a redirect, which would have
to keep the key somewhere (the session, a message cookie) until the next GET. Every response here
is ``no-store``, so neither the browser's cache nor a proxy keeps a copy.
"""

import uuid

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from assistant.models import ApiKey, Classroom
from assistant.services.api_key_access import class_key_visible, class_keys, key_shown
from assistant.services.api_keys import key_create, key_revoke
from assistant.teach_keys_forms import KeyNewForm, key_rate_max
from assistant.teach_views import SeeOther, teacher_view

#: Where the API answers, below the site's own address (routed in ``chatsite/asgi.py``).
API_BASE_PATH = "/v1"


@never_cache
@require_http_methods(["GET", "POST"])
@teacher_view
def class_keys_page(request: HttpRequest, classroom: Classroom) -> HttpResponse:
    """``/teach/<id>/keys``: the class's keys and how to use them. POST makes a key (400 with
    the form's errors for a bad name or rate, and nothing made) and answers with the page
    showing the new key's text, once: it is never shown again."""
    created: tuple[ApiKey, str] | None = None
    form = KeyNewForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        created = key_create(
            name=form.cleaned_data["name"],
            classroom=classroom,
            created_by=request.user,
            rate=form.cleaned_data["rate"],
        )
        form = KeyNewForm()
    context = {
        "classroom": classroom,
        "form": form,
        "rows": [(row, key_shown(row)) for row in class_keys(classroom)],
        "new_row": created[0] if created else None,
        "new_key": created[1] if created else None,
        "base_url": request.build_absolute_uri(API_BASE_PATH),
        "model": settings.CHATSITE_API["MODEL"],
        "site_rate": settings.CHATSITE_API["RATE"],
        "rate_max": key_rate_max(),
    }
    status = 400 if form.is_bound else 200
    return render(request, "assistant/teach/keys.html", context, status=status)


@require_POST
@teacher_view
def class_key_revoke(request: HttpRequest, classroom: Classroom, key_id: uuid.UUID) -> HttpResponse:
    """``POST /teach/<id>/keys/<key id>/revoke``: the key is refused from the next request on
    (a revoked key stays listed; revoking it again changes nothing). Then the keys page."""
    row = class_key_visible(classroom, key_id)
    key_revoke(row)
    messages.success(
        request,
        gettext("Key %(key)s revoked: it is refused from now on.") % {"key": key_shown(row)},
    )
    return SeeOther(reverse("teach:keys", args=[classroom.id]))
