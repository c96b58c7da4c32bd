"""The login form: Django's admin login, throttled per account and per address
(``services/logins.py``)."""

import math
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError
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


class ThrottledAuthenticationForm(AdminAuthenticationForm):
    """``AdminAuthenticationForm`` that refuses a locked username or address before checking the
    password, and counts each failure."""

    #: Seconds until the login may be tried again, when this attempt was refused for a lockout.
    locked_for: int | None = None

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username") or ""
        client = request_client(self.request) if self.request is not None else UNKNOWN
        self.locked_for = login_locked(username=username, client=client)
        if self.locked_for is not None:
            raise ValidationError(locked_message(self.locked_for), code="locked")
        try:
            cleaned = super().clean()
        except ValidationError as error:
            if error.code == "invalid_login":
                login_failed(username=username, client=client)
            raise
        login_succeeded(username=username)
        return cleaned
