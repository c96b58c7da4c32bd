"""The group writer's batch (``persistence.rows_write``): on PostgreSQL one statement in one
round trip (``batch_statement``), on SQLite one INSERT per table. Both store what the ORM
would, all of a batch or none of it, text that must survive binding included."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from assistant.models import Classroom, Conversation, Message, StreamRecord
from assistant.services import batch_statement as statements
from assistant.services.classrooms import join_code_new
from assistant.services.persistence import Rows, rows_write
from assistant.services.table_rows import insert_columns
from tests.support import row_of

pytestmark = pytest.mark.django_db

#: Quotes, a backslash, newlines, a tab, Chinese, an emoji and SQL that must stay text.
AWKWARD = "列\t表\n第二行\r\\N \\ $1 %s NULL '; DROP TABLE x; -- 🙂 **粗体**"

POSTGRES = connection.vendor == "postgresql"


def record(request_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "created_at": datetime(2026, 12, 4, 8, 30, 15, 123456, tzinfo=UTC),
        "owner_key": "session:abc",
        "path": "direct",
        "engine": "scripted",
        "server": "daphne",
        "outcome": StreamRecord.Outcome.OK,
        "message_id": uuid.uuid4(),
        **fields,
    }


def exchange(request_id: str, text: str = AWKWARD) -> list[Rows]:
    """A new conversation's question, its answer (touching the conversation) and its record,
    as the answer path submits them."""
    conversation = Conversation(owner_key="session:abc", title=text[:60])
    question = Message(conversation=conversation, role="user", content=text)
    answer = Message(
        conversation=conversation, role="assistant", content=text, finish_reason="stop"
    )
    return [
        Rows(conversations=[row_of(conversation)], messages=[row_of(question)]),
        Rows(messages=[row_of(answer)], touch=[conversation.id]),
        Rows(records=[record(request_id, conversation_id=conversation.id, tokens=20)]),
    ]


@pytest.fixture
def raw_statements() -> Iterator[list[str]]:
    """The statements sent through psycopg's ``RawCursor`` (the one-statement path)."""
    sent: list[str] = []
    execute = psycopg.RawCursor.execute

    def counted(self: psycopg.RawCursor, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psycopg.RawCursor, "execute", counted)
        yield sent


def test_a_batch_comes_back_as_it_was_given(raw_statements: list[str]) -> None:
    batch = exchange("r-1") + exchange("r-2", text="short")
    full = record("r-full", parse_ms=0.125, server_ttft_ms=51.5, itl_mean_ms=10.25, buffered=True)
    batch.append(Rows(records=[full, record("r-empty", classroom_id=None, parse_ms=None)]))
    with CaptureQueriesContext(connection) as queries:
        rows_write(batch)
    written = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]]
    if POSTGRES:  # one statement, past Django's cursor
        assert len(raw_statements) == 1 and not written
        assert raw_statements[0].startswith("WITH ")
    else:
        assert not raw_statements and len(written) == 3
    given = [
        model(**row)
        for rows in batch
        for model, table in (
            (Conversation, rows.conversations),
            (Message, rows.messages),
            (StreamRecord, rows.records),
        )
        for row in table
    ]
    for obj in given:
        if isinstance(obj, StreamRecord):  # its id is the database's
            stored = StreamRecord.objects.get(request_id=obj.request_id)
            assert model_to_dict(stored, exclude=["id"]) == model_to_dict(obj, exclude=["id"])
        else:
            stored = type(obj).objects.get(pk=obj.pk)
            assert model_to_dict(stored) == model_to_dict(obj), type(obj).__name__
    assert Message.objects.filter(content=AWKWARD).count() == 2
    assert StreamRecord.objects.get(request_id="r-full").created_at == full["created_at"]


def test_a_touch_moves_an_older_conversation_on() -> None:
    old = Conversation.objects.create(owner_key="session:abc", title="old")
    Conversation.objects.filter(pk=old.pk).update(updated_at=datetime(2026, 1, 1, tzinfo=UTC))
    answer = Message(conversation=old, role="assistant", content="a")
    rows_write([Rows(messages=[row_of(answer)], touch=[old.id])])
    old.refresh_from_db()
    assert old.updated_at.year == datetime.now(UTC).year and old.updated_at.month > 1


@pytest.mark.django_db(transaction=True)
def test_a_refused_row_stores_nothing_of_its_batch(raw_statements: list[str]) -> None:
    """Outside any transaction, as the writer's thread runs it: one statement, all or none."""
    rows_write(exchange("r-twice"))
    messages = Message.objects.count()
    with pytest.raises(IntegrityError):
        rows_write(exchange("r-new") + exchange("r-twice"))
    assert Message.objects.count() == messages
    assert list(StreamRecord.objects.values_list("request_id", flat=True)) == ["r-twice"]
    assert len(raw_statements) == (2 if POSTGRES else 0)
    rows_write(exchange("r-after"))  # the connection is usable after the refusal
    assert StreamRecord.objects.filter(request_id="r-after").exists()


def test_a_refusal_inside_a_transaction_leaves_the_transaction_usable() -> None:
    rows_write(exchange("r-twice"))
    with pytest.raises(IntegrityError):
        rows_write(exchange("r-twice"))
    assert Conversation.objects.count() == 1  # the test's own transaction still answers


def test_a_batch_too_large_for_one_statement_goes_table_by_table(
    raw_statements: list[str],
) -> None:
    batch = exchange("r-1") + exchange("r-2")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(statements, "MAX_PARAMS", 10)
        rows_write(batch)
    assert not raw_statements
    assert StreamRecord.objects.count() == 2 and Message.objects.count() == 4


def test_the_statement_numbers_its_parameters_in_order() -> None:
    conversation = Conversation(owner_key="o", title="t")
    tables = statements.Tables(
        messages=[
            row_of(Message(conversation=conversation, role="user", content=f"m{i}")) for i in (1, 2)
        ],
        touch={conversation.id},
    )
    made = statements.batch_statement(tables, connection)
    assert made is not None
    sql, params = made
    fields = len(insert_columns(Message, tables.messages, connection))
    assert "VALUES ($1, " in sql and f"${fields}), (${fields + 1}, " in sql  # two rows
    assert f"= ${2 * fields + 1} " in sql and sql.endswith(f"= ANY(${2 * fields + 2})")
    assert len(params) == 2 * fields + 2 and len(params[-1]) == 1
    assert statements.batch_statement(statements.Tables(), connection) is None


@pytest.mark.django_db(transaction=True)
def test_a_message_of_a_missing_conversation_is_refused_with_its_batch() -> None:
    """A conversation deleted while its answer ran: the foreign key, checked as the statement's
    transaction ends, refuses the batch (the writer then stores the rest one by one)."""
    orphan = Message(conversation_id=uuid.uuid4(), role="assistant", content="a")
    with pytest.raises(IntegrityError):
        rows_write([*exchange("r-with-orphan"), Rows(messages=[row_of(orphan)])])
    assert not Message.objects.exists() and not StreamRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_conversation_whose_class_was_deleted_is_stored_in_none(
    raw_statements: list[str],
) -> None:
    """A class deleted while its student's question was answered: the new conversation is
    stored in no class, as the class's other conversations were (``SET_NULL``), and another's
    class is kept. On PostgreSQL the statement checks it itself, in its one round trip; on
    SQLite a query looks first."""
    kept = Classroom.objects.create(name="kept", join_code=join_code_new())
    gone = Classroom.objects.create(name="gone", join_code=join_code_new())
    gone_id = gone.id
    gone.delete()
    in_kept, in_gone = exchange("r-kept"), exchange("r-gone")
    in_kept[0].conversations[0]["classroom_id"] = kept.id
    in_gone[0].conversations[0]["classroom_id"] = gone_id
    with CaptureQueriesContext(connection) as queries:
        rows_write(in_kept + in_gone)
    table = connection.ops.quote_name(Classroom._meta.db_table)
    looked = [q["sql"] for q in queries.captured_queries if f"FROM {table}" in q["sql"]]
    assert (len(looked), len(raw_statements)) == ((0, 1) if POSTGRES else (1, 0))
    assert Conversation.objects.get(pk=in_kept[0].conversations[0]["id"]).classroom_id == kept.id
    assert Conversation.objects.get(pk=in_gone[0].conversations[0]["id"]).classroom_id is None
    assert Message.objects.count() == 4 and StreamRecord.objects.count() == 2


def test_each_batch_names_the_columns_its_rows_give() -> None:
    """A record that gives its auto id is inserted with it, one that does not without it, in
    whichever order batches come (their INSERT's columns are made once for each)."""

    def columns(tables: statements.Tables) -> str:
        made = statements.batch_statement(tables, connection)
        assert made is not None
        return made[0].split(" VALUES ")[0]

    given = statements.Tables(records=[record("r-given", id=987_654_321)])
    left = statements.Tables(records=[record("r-left")])
    pk = connection.ops.quote_name(StreamRecord._meta.pk.column)
    assert pk not in columns(left)
    assert pk in columns(given)
    assert pk not in columns(left)
    assert columns(given).count(pk) == 1
