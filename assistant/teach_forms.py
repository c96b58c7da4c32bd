"""The teachers' forms: their login (throttled like the admin's), a new class, and a class's
settings within the bounds an admin sets (``CHATSITE_CLASS_BOUNDS``).

Bounds are read when a form is built, never at import, so a changed setting applies to the next
request; the same bounds become the inputs' ``min``/``max`` for the browser, and the server checks
them again whatever the browser sent.
"""

from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from assistant.forms import ThrottledLoginMixin
from assistant.models import Classroom
from assistant.services.teaching import CLASS_SETTINGS, class_bounds, is_teacher

#: A persona is sent with every question: long enough for a careful one, no longer.
PERSONA_MAX_CHARS = 4000
#: ``<input type="datetime-local">`` sends and shows this, without seconds or a zone.
DATETIME_LOCAL = "%Y-%m-%dT%H:%M"


@dataclass(frozen=True, slots=True)
class PersonaExample:
    """A starting point for a class's persona, in both languages a class may be taught in.
    Not translated: each text is a persona in its own language, shown side by side."""

    en: str
    zh: str


PERSONA_EXAMPLES = (
    PersonaExample(
        en="You are a patient physics tutor. Guide students with questions and hints; do not "
        "hand out homework answers.",
        zh="你是一位耐心的物理辅导老师。用提问和提示引导学生思考，不直接给出作业答案。",
    ),
    PersonaExample(
        en="You are an English writing coach for middle-school students. Point out one or two "
        "problems at a time and explain why; never rewrite the whole text for them.",
        zh="你是一位面向初中生的英语写作教练。每次指出一两个问题并解释原因，不替学生重写全文。",
    ),
    PersonaExample(
        en="You are a friendly maths teacher. Ask the student to show their working, check each "
        "step, and give the next hint only when they are stuck.",
        zh="你是一位亲切的数学老师。请学生写出解题过程，逐步检查，只在学生卡住时给出下一步提示。",
    ),
    PersonaExample(
        en="You are a history guide. Answer briefly, name your sources, and end with a question "
        "that makes the student think further.",
        zh="你是一位历史向导。回答简明扼要，说明依据的史料，并以一个引发学生进一步思考的问题结尾。",
    ),
)


class TeacherAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    """``/teach/login/``: a teacher's or an admin's account, throttled like the admin's login.
    Any other account is refused with the same message as a wrong password."""

    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        if not is_teacher(user):
            raise self.get_invalid_login_error()


class ClassNewForm(forms.Form):
    """A new class: its name; everything else is set on its page."""

    name = forms.CharField(label=_("Class name"), max_length=80)


class ClassSettingsForm(forms.Form):
    """A class's settings. Empty numbers and an empty engine mean the site's own."""

    name = forms.CharField(label=_("Class name"), max_length=80)
    persona = forms.CharField(
        label=_("Persona (the assistant's instructions for this class)"),
        required=False,
        max_length=PERSONA_MAX_CHARS,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text=_("Empty: the site's own instructions."),
    )
    temperature = forms.FloatField(
        label=_("Temperature"),
        required=False,
        min_value=0,
        help_text=_("Lower is more predictable, higher more varied. Empty: the site's."),
    )
    max_tokens = forms.IntegerField(
        label=_("Longest answer (tokens)"),
        required=False,
        min_value=1,
        help_text=_("Empty: the site's."),
    )
    engine_alias = forms.ChoiceField(label=_("Model"), required=False)
    chat_rate = forms.IntegerField(
        label=_("Questions per minute per student"),
        required=False,
        min_value=1,
        help_text=_("Empty: the site's."),
    )
    teachers_read = forms.BooleanField(
        label=_("Teachers may read the class's questions and answers"),
        required=False,
        help_text=_("Students are told before they join."),
    )
    code_expires_at = forms.DateTimeField(
        label=_("Join code expires"),
        required=False,
        input_formats=[DATETIME_LOCAL],
        widget=forms.DateTimeInput(format=DATETIME_LOCAL, attrs={"type": "datetime-local"}),
        help_text=_(
            "Empty: never. In your device's time zone. Students already in the class stay in it."
        ),
    )
    #: The browser's time zone (IANA name, set by teach.js), which ``code_expires_at`` is typed
    #: in; empty without JavaScript: the site's (``TIME_ZONE``), which the page then shows.
    zone = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bounds = class_bounds()
        self._bound("temperature", bounds["TEMPERATURE_MAX"])
        self._bound("max_tokens", int(bounds["MAX_TOKENS_MAX"]))
        self._bound("chat_rate", int(bounds["CHAT_RATE_MAX"]))
        engine = self.fields["engine_alias"]
        engine.choices = [  # type: ignore[attr-defined]
            ("", _("The site's model")),
            *((alias, alias) for alias in settings.CHATSITE_ENGINES),
        ]

    def clean_zone(self) -> ZoneInfo | None:
        name = self.cleaned_data["zone"]
        if not name:
            return None
        try:
            return ZoneInfo(name)
        except (ValueError, ZoneInfoNotFoundError):
            raise ValidationError(_("Unknown time zone."), code="zone") from None

    def clean(self) -> dict[str, Any]:
        """``code_expires_at`` as the teacher meant it: the wall-clock time they typed, in their
        browser's zone (Django read it in the site's)."""
        cleaned = super().clean()
        expires, zone = cleaned.get("code_expires_at"), cleaned.get("zone")
        if expires is not None and zone is not None:
            cleaned["code_expires_at"] = timezone.make_aware(timezone.make_naive(expires), zone)
        return cleaned

    def changes(self) -> dict[str, Any]:
        """The valid form's values, as ``class_settings_change`` takes them."""
        return {name: self.cleaned_data[name] for name in CLASS_SETTINGS}

    def _bound(self, name: str, maximum: float) -> None:
        """Give ``name`` its upper bound: a validator for the server, ``max`` for the browser."""
        field = self.fields[name]
        field.max_value = maximum  # type: ignore[attr-defined]
        field.validators.append(MaxValueValidator(maximum))
        field.widget.attrs["max"] = maximum

    @classmethod
    def of(cls, classroom: Classroom) -> "ClassSettingsForm":
        """The form showing ``classroom``'s settings now."""
        form = cls(initial={name: getattr(classroom, name) for name in CLASS_SETTINGS})
        if classroom.code_expires_at is not None:
            # teach.js shows it in the browser's zone; without it, the site's zone is shown.
            expires = form.fields["code_expires_at"].widget
            expires.attrs["data-utc"] = classroom.code_expires_at.isoformat()
        return form
