"""The admin lists conversations, messages and stream records; records are read-only."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from assistant.models import Conversation, Message, StreamRecord

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = User.objects.create_superuser("teacher", "t@example.invalid", "pw-long-enough-123")
    client = Client()
    client.force_login(user)
    return client


def record(request_id: str, path: str, outcome: str) -> StreamRecord:
    return StreamRecord.objects.create(
        request_id=request_id,
        created_at=timezone.now(),
        owner_key="session:x",
        path=path,
        engine="scripted",
        outcome=outcome,
        server_ttft_ms=12.5,
    )


def test_stream_records_are_listed_filterable_and_read_only(staff: Client) -> None:
    ok = record("req-ok-000001", "direct", "ok")
    record("req-aborted-02", "direct", "client_abort")
    listed = staff.get("/admin/assistant/streamrecord/?outcome__exact=ok")
    assert listed.status_code == 200
    assert b"req-ok-000001" in listed.content and b"req-aborted-02" not in listed.content
    assert staff.get("/admin/assistant/streamrecord/add/").status_code == 403
    detail = staff.get(f"/admin/assistant/streamrecord/{ok.pk}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    response = staff.post(f"/admin/assistant/streamrecord/{ok.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert StreamRecord.objects.filter(pk=ok.pk).exists()


def test_conversations_and_messages_are_listed_with_filters(staff: Client) -> None:
    conversation = Conversation.objects.create(owner_key="session:x", title="Volcanoes")
    Message.objects.create(
        conversation=conversation, role="assistant", content="Magma", status="partial"
    )
    assert b"Volcanoes" in staff.get("/admin/assistant/conversation/").content
    partial = staff.get("/admin/assistant/message/?status__exact=partial")
    assert partial.status_code == 200 and b"Volcanoes" in partial.content
    assert (
        staff.get("/admin/assistant/message/?status__exact=complete").content.count(b"Volcanoes")
        == 0
    )


def test_admin_needs_staff() -> None:
    anonymous = Client().get("/admin/assistant/streamrecord/")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]


def test_the_breaker_log_is_listed_and_read_only(staff: Client) -> None:
    from assistant.models import BreakerEvent
    from assistant.services.serving import split_change

    split_change(percent=25, mode=None, actor="teacher")
    event = BreakerEvent.objects.get()
    listed = staff.get("/admin/assistant/breakerevent/?kind__exact=split_changed")
    assert listed.status_code == 200 and b"set the candidate share to 25%" in listed.content
    assert staff.get("/admin/assistant/breakerevent/add/").status_code == 403
    response = staff.post(f"/admin/assistant/breakerevent/{event.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
