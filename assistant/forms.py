"""The login forms: Django's, throttled per account and per address (``services/logins.py``).

The throttle is one mixin, ``ThrottledLoginMixin``, over the admin's form (staff, at
``/admin/login/``) and the teachers' (``teach_forms.py``, at ``/teach/login/``); ``login_answer``
turns either page's refusal of a locked-out attempt into a 429 with Retry-After, so the two logins
refuse the same way.
"""

import math
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponseBase
from django.utils.translation import ngettext

from assistant.services.clients import UNKNOWN, request_client
from assistant.services.logins import login_failed, login_locked, login_succeeded


def locked_message(retry_after_s: int) -> str:
    """What the login page says to a locked account or address, in the request's language."""
    minutes = math.ceil(retry_after_s / 60)
    return ngettext(
        "Too many failed logins for this account or from this address. Logging in is locked "
        "for now: try again in %(minutes)d minute.",
        "Too many failed logins for this account or from this address. Logging in is locked "
        "for now: try again in %(minutes)d minutes.",
        minutes,
    ) % {"minutes": minutes}


class ThrottledLoginMixin:
    """Before an ``AuthenticationForm``: refuses a locked username or address before checking
    the password, and counts each failure (a refusal by ``confirm_login_allowed`` with code
    ``invalid_login`` included, so a guesser learns nothing from which accounts may log in)."""

    request: HttpRequest | None
    cleaned_data: dict[str, Any]

    #: Seconds until the login may be tried again, when this attempt was refused for a lockout.
    locked_for: int | None = None

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        client = request_client(self.request) if self.request is not None else UNKNOWN
        self.locked_for = login_locked(username=username, client=client)
        if self.locked_for is not None:
            raise ValidationError(locked_message(self.locked_for), code="locked")
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except ValidationError as error:
            if error.code == "invalid_login":
                login_failed(username=username, client=client)
            raise
        login_succeeded(username=username)
        return cleaned


class ThrottledAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    """The admin's login form (staff only), throttled."""


def login_answer(response: HttpResponseBase) -> HttpResponseBase:
    """A login page's response (a ``LoginView``'s or the admin's), answered 429 with
    Retry-After when its form refused a locked-out attempt; any other response as it is."""
    context = getattr(response, "context_data", None) or {}
    locked_for = getattr(context.get("form"), "locked_for", None)
    if locked_for is not None:
        response.status_code = 429
        response.headers["Retry-After"] = str(locked_for)
    return response
