"""Admin: conversations and messages for moderation; classes and their teachers; stream records,
the breaker's log and class membership read-only (the split itself is changed on the dashboard,
where the change is logged).

A teacher account is a user in the "Teachers" group (not staff): add one under Users, or with
``manage.py teacher_add``."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from assistant.forms import ThrottledAuthenticationForm
from assistant.models import (
    BreakerEvent,
    ClassMember,
    Classroom,
    Conversation,
    Message,
    StreamRecord,
)

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
