"""The form a teacher makes an API key for their class with (``teach_keys_views.py``).

A key's rate is bounded for teachers by the class bounds an admin sets: a key serves a tool
that a whole class may use at once, so it may ask up to ``KEY_RATE_FACTOR`` times the most
questions a minute one student may get (``CHATSITE_CLASS_BOUNDS["CHAT_RATE_MAX"]``). The bound is
read when the form is built, never at import, and becomes the input's ``max`` for the browser;
the server checks it again whatever the browser sent. Admins set any rate in the admin.
"""

from typing import Any

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator
from django.utils.translation import gettext_lazy as _

from assistant.services.teaching import class_bounds

#: A key's most requests a minute, as a multiple of the most questions a minute per student.
KEY_RATE_FACTOR = 10
#: The longest name a key may have (``ApiKey.name``).
KEY_NAME_MAX_CHARS = 80


def key_rate_max() -> int:
    """The most requests a minute a teacher may give a key, under the site's settings now."""
    return int(class_bounds()["CHAT_RATE_MAX"]) * KEY_RATE_FACTOR


class KeyNewForm(forms.Form):
    """A new key for a class: a name to tell it apart by, and optionally its own rate."""

    name = forms.CharField(
        label=_("Key name"),
        max_length=KEY_NAME_MAX_CHARS,
        help_text=_("What the key is for, e.g. the tool or the student group using it."),
    )
    rate = forms.IntegerField(
        label=_("Requests per minute"),
        required=False,
        min_value=1,
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        maximum = key_rate_max()
        rate = self.fields["rate"]
        rate.max_value = maximum  # type: ignore[attr-defined]
        rate.validators.append(MaxValueValidator(maximum))
        rate.widget.attrs["max"] = maximum
        rate.help_text = _("From 1 to %(max)s. Empty: the site's (%(site)s).") % {
            "max": maximum,
            "site": settings.CHATSITE_API["RATE"],
        }
