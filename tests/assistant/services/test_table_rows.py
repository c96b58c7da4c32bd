"""The group writer's rows (``table_rows``) are prepared for the database as Django prepares the
same rows as model instances (``pre_save``, then ``get_db_prep_save``), on the backend the
suite runs on: the same values, of the same types, column for column."""

import uuid
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper
from django.utils import timezone
from pytest_django.fixtures import Settings

from assistant.models import Conversation, Message, StreamRecord
from assistant.services.conversations import Exchange, answer_rows, question_rows
from assistant.services.table_rows import Column, Row, insert_columns, insert_head, insert_values
from assistant.services.telemetry import AnswerSummary, refused_record, stream_record
from assistant.services.timings import StreamTimings

Outcome = StreamRecord.Outcome


def exchange(*, new: bool) -> Exchange:
    return Exchange(
        conversation_id=uuid.uuid4(),
        user_message_id=uuid.uuid4(),
        answer_message_id=uuid.uuid4(),
        is_new_conversation=new,
        request_id=uuid.uuid4().hex,
    )


def timings(tokens: int) -> StreamTimings:
    made = StreamTimings(received=1.0, parsed=1.001, engine_submitted=1.002)
    if tokens:
        made.engine_first_delta = 1.05
    for token in range(tokens):
        made.token_sent(1.051 + token * 0.01)
    made.finished = 1.3
    return made


def summary(outcome: Outcome, tokens: int, code: str = "") -> AnswerSummary:
    asked = exchange(new=True)
    return AnswerSummary(
        request_id=asked.request_id,
        owner_key="session:abc",
        classroom_id=uuid.uuid4(),
        serving_path="direct",
        engine="scripted",
        outcome=outcome,
        error_code=code,
        conversation_id=asked.conversation_id,
        message_id=asked.answer_message_id,
        timings=timings(tokens),
    )


def built_rows() -> list[tuple[type[models.Model], Row]]:
    """One of each row the answer path builds."""
    asked = exchange(new=True)
    question = question_rows(
        owner_key="session:abc", classroom_id=uuid.uuid4(), exchange=asked, question="光合作用?"
    )
    partial = answer_rows(
        exchange=asked, content="Light", outcome=Outcome.CLIENT_ABORT, finish_reason="aborted"
    )
    complete = answer_rows(
        exchange=exchange(new=False), content="Done.", outcome=Outcome.OK, finish_reason="stop"
    )
    refused = refused_record(
        request_id="r-refused",
        owner_key="session:abc",
        classroom_id=None,
        serving_path="django",
        engine="scripted",
        reason="engine_busy",
        timings=timings(0),
    )
    return [
        (Conversation, question.conversations[0]),
        (Message, question.messages[0]),
        (Message, partial.messages[0]),
        (Message, complete.messages[0]),
        (StreamRecord, stream_record(summary(Outcome.OK, 20))),
        (StreamRecord, stream_record(summary(Outcome.ENGINE_ERROR, 3, "engine_failed"))),
        (StreamRecord, refused),
    ]


def written_at(column: Column, value: Any) -> datetime:
    """A prepared ``auto_now`` value as a naive UTC time (SQLite's is text, naive UTC)."""
    moment = column.field.to_python(value)
    return moment.astimezone(UTC).replace(tzinfo=None) if timezone.is_aware(moment) else moment


def djangos(model: type[models.Model], row: Row, fields: list[models.Field]) -> list[Any]:
    """The row's values as ``bulk_create`` prepares a model instance of it."""
    obj = model(**row)
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


@pytest.mark.parametrize("index", range(7))
def test_a_built_row_is_prepared_as_django_prepares_its_instance(index: int) -> None:
    model, row = built_rows()[index]
    columns = insert_columns(model, [row], connection)
    fields = [c.field for c in columns]
    before = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    (ours,) = insert_values(columns, [row], connection)
    theirs = djangos(model, row, fields)
    assert [f.attname for f in fields] == [
        f.attname
        for f in model._meta.concrete_fields
        if f is not model._meta.auto_field or row.get(f.attname) is not None
    ]
    for column, mine, django in zip(columns, ours, theirs, strict=True):
        if column.now:  # the time it is written, prepared alike
            assert type(mine) is type(django), column.name
            assert written_at(column, mine) >= before, column.name
        else:
            assert (type(mine), mine) == (type(django), django), column.name


def test_a_field_left_out_gets_its_default_made_for_each_row() -> None:
    conversation_id = uuid.uuid4()
    rows: list[Row] = [
        {"conversation_id": conversation_id, "role": "user", "content": "a"},
        {"conversation_id": conversation_id, "role": "user", "content": "b"},
    ]
    columns = insert_columns(Message, rows, connection)
    names = [c.name for c in columns]
    first, second = insert_values(columns, rows, connection)
    at = names.index("id")
    assert first[at] != second[at]  # uuid4, called per row
    assert (
        first[names.index("status")]
        == djangos(Message, rows[0], [c.field for c in columns])[names.index("status")]
    )
    assert first[names.index("replaced_at")] is None


def test_an_auto_now_field_is_the_time_written_whatever_the_row_says() -> None:
    stale = datetime(2020, 1, 1, tzinfo=UTC)
    row: Row = {"id": uuid.uuid4(), "owner_key": "o", "title": "t", "created_at": stale}
    columns = insert_columns(Conversation, [row], connection)
    (values,) = insert_values(columns, [row], connection)
    for column, value in zip(columns, values, strict=True):
        if column.now:
            assert written_at(column, value).year >= 2026


def test_an_auto_primary_key_is_left_to_the_database_unless_a_row_gives_one() -> None:
    record = stream_record(summary(Outcome.OK, 1))
    assert "id" not in [c.name for c in insert_columns(StreamRecord, [record], connection)]
    given = {**record, "id": 7}
    assert "id" in [c.name for c in insert_columns(StreamRecord, [record, given], connection)]


def test_an_insert_head_names_its_columns_in_order_with_or_without_the_auto_id() -> None:
    """Made once for each set of columns: rows with and without their auto id, in turn, each
    get the head for theirs."""
    left = stream_record(summary(Outcome.OK, 1))
    given = {**left, "id": 7}
    quote = connection.ops.quote_name
    for rows in ([left], [given], [left], [left, given]):
        columns, head = insert_head(StreamRecord, rows, connection)
        assert columns == insert_columns(StreamRecord, rows, connection)
        names = ", ".join(quote(c.field.column) for c in columns)
        assert head == f"INSERT INTO {quote(StreamRecord._meta.db_table)} ({names})"


@pytest.fixture
def sqlite() -> BaseDatabaseWrapper:
    """A SQLite connection's preparation, whichever backend the suite runs on (preparing a value
    opens nothing)."""
    return SQLiteWrapper({**connection.settings_dict, "NAME": ":memory:"}, alias="sqlite-check")


SHANGHAI = ZoneInfo("Asia/Shanghai")


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 12, 5, 8, 15, 2, 47000, tzinfo=UTC),
        datetime(2026, 12, 5, 16, 15, 2, tzinfo=SHANGHAI),
        datetime(2026, 12, 5, 16, 15, 2, 999999, tzinfo=timezone.get_fixed_timezone(-150)),
        None,
    ],
    ids=["utc", "shanghai", "offset", "none"],
)
@pytest.mark.parametrize("zone", [None, "Asia/Shanghai"], ids=["connection-utc", "connection-cst"])
def test_a_datetime_is_bound_on_sqlite_as_django_binds_it(
    value: datetime | None, zone: str | None
) -> None:
    """In the connection's time zone (UTC unless its ``TIME_ZONE`` says), whether or not the
    value is in it already."""
    sqlite = SQLiteWrapper(
        {**connection.settings_dict, "NAME": ":memory:", "TIME_ZONE": zone}, alias="sqlite-check"
    )
    field = StreamRecord._meta.get_field("created_at")
    (column,) = [c for c in insert_columns(StreamRecord, [], sqlite) if c.field is field]
    assert column.prepare is not None
    ours, theirs = column.prepare(value, sqlite), field.get_db_prep_save(value, sqlite)
    assert (type(ours), ours) == (type(theirs), theirs)


def test_an_aware_datetime_with_time_zones_off_is_refused_as_django_refuses_it(
    settings: Settings,
) -> None:
    settings.USE_TZ = False
    sqlite = SQLiteWrapper({**connection.settings_dict, "NAME": ":memory:"}, alias="sqlite-check")
    field = StreamRecord._meta.get_field("created_at")
    (column,) = [c for c in insert_columns(StreamRecord, [], sqlite) if c.field is field]
    assert column.prepare is not None
    value = datetime(2026, 12, 5, 8, 15, 2, tzinfo=UTC)
    with pytest.raises(ValueError, match="USE_TZ is False") as theirs:
        field.get_db_prep_save(value, sqlite)
    with pytest.raises(ValueError, match="USE_TZ is False") as ours:
        column.prepare(value, sqlite)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "value",
    [uuid.UUID("12345678-1234-5678-1234-567812345678"), "12345678123456781234567812345678", None],
    ids=["uuid", "hex", "none"],
)
@pytest.mark.parametrize("name", ["id", "conversation_id"])
def test_a_uuid_is_bound_on_sqlite_as_django_binds_it(
    sqlite: BaseDatabaseWrapper, name: str, value: uuid.UUID | str | None
) -> None:
    (column,) = [c for c in insert_columns(Message, [], sqlite) if c.name == name]
    assert column.prepare is not None
    ours, theirs = column.prepare(value, sqlite), column.field.get_db_prep_save(value, sqlite)
    assert (type(ours), ours) == (type(theirs), theirs)


@pytest.mark.parametrize("value", [0, 7, 2**40, None, "7", True], ids=repr)
@pytest.mark.parametrize("name", ["tokens", "client_tokens"])
def test_an_integer_is_bound_on_sqlite_as_django_binds_it(
    sqlite: BaseDatabaseWrapper, name: str, value: int | str | None
) -> None:
    (column,) = [c for c in insert_columns(StreamRecord, [], sqlite) if c.name == name]
    assert column.prepare is not None
    ours, theirs = column.prepare(value, sqlite), column.field.get_db_prep_save(value, sqlite)
    assert (type(ours), ours) == (type(theirs), theirs)
