"""Owner keys are not credentials: nothing a member of staff can read (admin, dashboard, APIs)
works as a student's session cookie, and rows stored before hold the pseudonym after migrating.
"""

import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from assistant.models import Conversation, Message, StreamRecord
from assistant.services.identity import session_pseudonym
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Anything shaped like a Django session key (32 of [a-z0-9]) or longer.
COOKIE_SHAPED = re.compile(rb"[a-z0-9]{32,}")


def test_nothing_staff_can_read_works_as_a_students_cookie(daphne: LiveServer) -> None:
    student = ChatClient(daphne)
    try:
        meta = student.ask("[scripted tokens=2 ttft_ms=0] Why do volcanoes erupt?")[0].json()
        key = student.session_key
    finally:
        student.close()
    conversation = wait_for(lambda: Conversation.objects.filter(id=meta["conversation"]).first())
    record = wait_for(lambda: StreamRecord.objects.filter(request_id=meta["request_id"]).first())
    message = wait_for(lambda: Message.objects.filter(id=meta["message"]).first())
    assert conversation.owner_key == record.owner_key == f"session:{session_pseudonym(key)}"

    admin = User.objects.create_superuser("admin", "a@example.invalid", "pw-long-enough-123")
    staff = Client()
    staff.force_login(admin)
    pages = [
        "/admin/assistant/conversation/",
        f"/admin/assistant/conversation/?q={conversation.owner_key}",
        f"/admin/assistant/conversation/{conversation.pk}/change/",
        "/admin/assistant/message/",
        f"/admin/assistant/message/{message.pk}/change/",
        "/admin/assistant/streamrecord/",
        f"/admin/assistant/streamrecord/{record.pk}/change/",
        "/dashboard/",
        "/dashboard/api/snapshot?window=1h",
        "/api/conversations",
    ]
    seen = b""
    for url in pages:
        response = staff.get(url)
        assert response.status_code == 200, url
        seen += response.content
    assert conversation.owner_key.encode() in seen  # the admin still lists and finds owners
    assert key.encode() not in seen

    # Every cookie-shaped string on those pages, tried as the student's session cookie.
    candidates = set(COOKIE_SHAPED.findall(seen))
    assert conversation.owner_key.removeprefix("session:").encode() in candidates
    for candidate in candidates:
        thief = Client()
        thief.cookies["sessionid"] = candidate.decode()
        listed = thief.get("/api/conversations").json()["conversations"]
        assert str(conversation.id) not in {c["id"] for c in listed}
    # The real key does open them (the check above could tell).
    owner = Client()
    owner.cookies["sessionid"] = key
    assert [c["id"] for c in owner.get("/api/conversations").json()["conversations"]] == [
        str(conversation.id)
    ]


def test_rows_stored_with_session_keys_are_migrated_to_the_pseudonym() -> None:
    before, after = ("assistant", "0005_given_up"), ("assistant", "0006_owner_pseudonyms")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    key = "abcdefghijklmnopqrstuvwxyz012345"
    student = old.get_model("assistant", "Conversation").objects.create(
        owner_key=f"session:{key}", title="Old"
    )
    staff = old.get_model("assistant", "Conversation").objects.create(
        owner_key="user:7", title="Staff"
    )
    old.get_model("assistant", "StreamRecord").objects.create(
        request_id="stored-before-01",
        created_at=timezone.now(),
        owner_key=f"session:{key}",
        path="direct",
        engine="scripted",
        outcome="ok",
    )
    executor = MigrationExecutor(connection)
    executor.migrate([after])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    pseudonym = f"session:{session_pseudonym(key)}"
    assert Conversation.objects.get(pk=student.pk).owner_key == pseudonym
    assert Conversation.objects.get(pk=staff.pk).owner_key == "user:7"
    assert StreamRecord.objects.get(request_id="stored-before-01").owner_key == pseudonym
