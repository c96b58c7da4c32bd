"""Admin: conversations and messages for moderation; classes and their teachers; stream records,
the breaker's log and class membership read-only (the split itself is changed on the dashboard,
where the change is logged).

A teacher account is a user in the "Teachers" group (not staff): add one under Users, or with
``manage.py teacher_add``.

API keys are made here through ``services/api_keys.key_create`` (as on a class's keys page and by
``manage.py apikey``): the key's text is shown once, in the response to adding it, and only its
hash is stored, which no page of the admin shows."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext, gettext_lazy, ngettext

from assistant.forms import ThrottledAuthenticationForm
from assistant.models import (
    ApiKey,
    BreakerEvent,
    ClassMember,
    Classroom,
    Conversation,
    Message,
    StreamRecord,
)
from assistant.services.api_key_access import key_shown
from assistant.services.api_keys import key_create, key_revoke

# Logins are throttled per account and per address (services/logins.py).
admin.site.login_form = ThrottledAuthenticationForm


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("role", "status", "content", "created_at")
    readonly_fields = ("created_at",)
    extra = 0


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner_key", "created_at", "updated_at")
    list_filter = (("updated_at", admin.DateFieldListFilter),)
    search_fields = ("title", "owner_key")
    inlines = (MessageInline,)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("conversation", "role", "status", "finish_reason", "created_at")
    list_filter = ("role", "status", ("created_at", admin.DateFieldListFilter))
    search_fields = ("content", "request_id")


class ReadOnlyAdmin(admin.ModelAdmin):
    """Evidence: visible to staff, never edited by hand."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(StreamRecord)
class StreamRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "request_id",
        "created_at",
        "path",
        "engine",
        "outcome",
        "server_ttft_ms",
        "client_ttft_ms",
        "tokens",
        "buffered",
    )
    list_filter = (
        "path",
        "outcome",
        "engine",
        "buffered",
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("request_id",)
    date_hierarchy = "created_at"


@admin.register(BreakerEvent)
class BreakerEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "breaker", "actor", "message")
    list_filter = ("kind", ("created_at", admin.DateFieldListFilter))
    search_fields = ("message", "actor")


class ClassMemberInline(admin.TabularInline):
    """Who joined the class: the students' own doing, so shown, never edited."""

    model = ClassMember
    fields = ("nickname", "owner_key", "joined_at", "left_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Classroom)
class ClassroomAdmin(admin.ModelAdmin):
    list_display = ("name", "join_code", "paused", "teachers_read", "updated_at")
    list_filter = ("paused", "teachers_read")
    search_fields = ("name", "join_code")
    filter_horizontal = ("teachers",)
    readonly_fields = ("created_at", "updated_at")
    inlines = (ClassMemberInline,)


@admin.register(ClassMember)
class ClassMemberAdmin(ReadOnlyAdmin):
    list_display = ("classroom", "nickname", "joined_at", "left_at")
    list_filter = (("joined_at", admin.DateFieldListFilter),)
    search_fields = ("nickname", "classroom__name", "classroom__join_code")
    list_select_related = ("classroom",)


class ApiKeyForm(forms.ModelForm):
    """What an admin types for a key: its name, its class (none: the site's key) and its rate;
    the key itself is made by ``key_create`` when it is saved."""

    # 0 would refuse every request: a key is stopped by revoking it.
    rate = forms.IntegerField(
        label=gettext_lazy("Requests per minute"),
        required=False,
        min_value=1,
        help_text=gettext_lazy("Empty: the site's (CHATSITE_API_RATE)."),
    )

    class Meta:
        model = ApiKey
        fields = ("name", "classroom", "rate")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys for the site or a class. Adding one shows its text once; a key's name and rate may
    be changed later, nothing else; a key is stopped by revoking it (an action), not deleted,
    so that its records still name it."""

    form = ApiKeyForm
    list_display = ("name", "prefix", "classroom", "rate", "created_at", "revoked_at", "created_by")
    list_filter = (
        ("revoked_at", admin.EmptyFieldListFilter),
        ("classroom", admin.RelatedOnlyFieldListFilter),
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("name", "prefix")
    list_select_related = ("classroom", "created_by")
    actions = ("revoke_selected",)

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "classroom", "rate")
        return ("name", "rate", "prefix", "classroom", "created_by", "created_at", "revoked_at")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple:
        if obj is None:
            return ()
        return ("prefix", "classroom", "created_by", "created_at", "revoked_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        """A change saves the name and the rate; an addition makes the key with ``key_create``
        and shows its text, this once."""
        if change:
            obj.save(update_fields=["name", "rate"])
            return
        row, key = key_create(
            name=obj.name, classroom=obj.classroom, created_by=request.user, rate=obj.rate
        )
        # The admin goes on with ``obj`` (its log entry, then ``response_add``).
        for field in ApiKey._meta.concrete_fields:
            setattr(obj, field.attname, getattr(row, field.attname))
        obj._state.adding, obj._state.db = False, row._state.db
        obj._created_key = key  # type: ignore[attr-defined]

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The new key's text, in this response only: not in a message, which would keep it
        in a cookie or the session until shown."""
        key = getattr(obj, "_created_key", None)
        if key is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": obj,
            "key": key,
            "title": gettext("New key"),
        }
        response = TemplateResponse(request, "admin/assistant/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description=gettext_lazy("Revoke selected keys"))
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = [row for row in queryset if row.revoked_at is None]
        for row in revoked:
            key_revoke(row)
        messages.success(
            request,
            ngettext(
                "%(count)d key revoked: %(keys)s.",
                "%(count)d keys revoked: %(keys)s.",
                len(revoked),
            )
            % {"count": len(revoked), "keys": ", ".join(key_shown(row) for row in revoked) or "—"},
        )
