"""``persistence.insert_many``: the group writer's INSERT (SQLite) or COPY (PostgreSQL) stores
what the ORM would, text a COPY must escape included, and a refused row is Django's
``IntegrityError`` on both."""

import uuid
from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from assistant.models import Conversation, Message, StreamRecord
from assistant.services.persistence import insert_many

pytestmark = pytest.mark.django_db

#: What COPY's text format has to escape (tab, newline, carriage return, backslash, the
#: ``\\N`` that means NULL there), beside Chinese, an emoji and SQL that must stay text.
AWKWARD = "列\t表\n第二行\r\\N \\ NULL '; DROP TABLE x; -- 🙂 **粗体**"


def record(request_id: str, **fields: object) -> StreamRecord:
    return StreamRecord(
        request_id=request_id,
        created_at=datetime(2026, 12, 4, 8, 30, 15, 123456, tzinfo=UTC),
        owner_key="session:abc",
        path="direct",
        engine="scripted",
        server="daphne",
        outcome=StreamRecord.Outcome.OK,
        **fields,
    )


def test_rows_come_back_as_they_were_given() -> None:
    conversation = Conversation(owner_key="session:abc", title=AWKWARD)
    message = Message(
        conversation=conversation, role="assistant", content=AWKWARD, finish_reason="stop"
    )
    full = record(
        "r-full",
        conversation_id=conversation.id,
        message_id=message.id,
        tokens=20,
        parse_ms=0.125,
        server_ttft_ms=51.5,
        itl_mean_ms=10.25,
        buffered=True,
        error_code="",
    )
    empty = record("r-empty", classroom_id=None, parse_ms=None)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        insert_many(Conversation, [conversation])
        insert_many(Message, [message])
        insert_many(StreamRecord, [full, empty])
    inserts = [q for q in queries.captured_queries if "INSERT INTO" in q["sql"]]
    # PostgreSQL's rows go as a COPY (not a statement Django logs); SQLite's as INSERTs.
    assert len(inserts) == (0 if connection.vendor == "postgresql" else 3)

    stored = Conversation.objects.get(pk=conversation.pk)
    assert stored.title == AWKWARD
    assert Message.objects.get(pk=message.pk).content == AWKWARD
    assert Message.objects.get(pk=message.pk).created_at is not None  # auto_now_add filled
    for given in (full, empty):
        got = StreamRecord.objects.get(request_id=given.request_id)
        assert model_to_dict(got, exclude=["id"]) == model_to_dict(given, exclude=["id"])
        assert got.created_at == given.created_at


def test_a_refused_row_is_an_integrity_error_and_stores_nothing() -> None:
    # One stream per request id: among records of answers (with a message).
    insert_many(StreamRecord, [record("r-twice", message_id=uuid.uuid4())])
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_many(
            StreamRecord,
            [record("r-new", message_id=uuid.uuid4()), record("r-twice", message_id=uuid.uuid4())],
        )
    assert list(StreamRecord.objects.values_list("request_id", flat=True)) == ["r-twice"]


def test_a_message_of_a_missing_conversation_is_refused() -> None:
    orphan = Message(conversation_id=uuid.uuid4(), role="user", content="q")
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_many(Message, [orphan])
        connection.check_constraints()  # SQLite checks foreign keys at the end
    assert not Message.objects.exists()
