"""A group writer's batch as one statement on PostgreSQL: one round trip, a transaction of its
own.

Stored table by table, a batch costs the writer a round trip to PostgreSQL for each statement
(each table's INSERT, the touch's UPDATE, the COMMIT), and the CPU of a round trip, the system
calls on either side of the socket, is most of what a small batch costs the worker: under the
load of a class the writer's batches are one or two answers. Here the batch's INSERTs and its
UPDATE are the parts of one statement (data-modifying ``WITH`` queries), which PostgreSQL runs
as a transaction of its own when none is open, all of it or none of it.

Values are bound on the server with PostgreSQL's own placeholders (``$1``, ``$2``, ...), through
psycopg's ``RawCursor``, which adapts them in C. Django's cursor binds on the client, formatting
each value as an SQL literal in Python, and its ``%s`` placeholders are parsed anew on every
call for a query this long.

The parts see the tables as they were before the statement: a conversation inserted by it is not
touched by its UPDATE (its ``updated_at`` is set as it is inserted). A message may come in the
same statement as its new conversation: Django's foreign keys on PostgreSQL are checked when the
transaction ends (``DEFERRABLE INITIALLY DEFERRED``). A foreign key the database empties when its
target is deleted (``SET_NULL``: a new conversation's class) goes in through a subquery that
gives NULL where the target is gone (``_set_null_checks``): the row is stored as it would have
been had it been there when its target was deleted, in the same statement, where a query of its
own would cost the batch a round trip and an ORM query more (``table_writes.classes_gone``,
SQLite's way).
"""

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from assistant.models import Conversation, Message, StreamRecord
from assistant.services.table_rows import (
    Column,
    Row,
    insert_columns,
    insert_head,
    insert_values,
)

#: PostgreSQL's limit on a statement's parameters (their count is a 16-bit integer).
MAX_PARAMS = 65535


@dataclass(slots=True)
class Tables:
    """What a batch stores, table by table (``table_rows``' rows)."""

    conversations: list[Row] = field(default_factory=list)
    messages: list[Row] = field(default_factory=list)
    #: Conversations whose ``updated_at`` moves to now.
    touch: set[Any] = field(default_factory=set)
    records: list[Row] = field(default_factory=list)


def _insert(
    model: type[models.Model], objs: list[Row], connection: BaseDatabaseWrapper, params: list[Any]
) -> str:
    """``INSERT INTO table (...) VALUES ($n, ...), ...`` for ``objs``; their values are added to
    ``params``."""
    fields, head = insert_head(model, objs, connection)
    checks = _set_null_checks(model, fields, connection)
    rows = []
    for values in insert_values(fields, objs, connection):
        start = len(params)
        params.extend(values)
        rows.append(_placeholders(start, len(values), checks))
    return f"{head} VALUES {', '.join(rows)}"


#: A row's value checked against its target: where it goes, and the subquery it goes through.
type Checks = tuple[tuple[int, str], ...]

#: ``_set_null_checks`` by model, vendor and number of columns (which says whether the auto
#: primary key is among them): the same few for the life of the process.
_checks: dict[tuple[type[models.Model], str, int], Checks] = {}


def _set_null_checks(
    model: type[models.Model], columns: tuple[Column, ...], connection: BaseDatabaseWrapper
) -> Checks:
    """The foreign keys among ``columns`` that the database sets to NULL when their target is
    deleted: each one's position, and ``(SELECT key FROM target WHERE key = {})``, which gives
    the value where the target is there and NULL where it is not."""
    key = (model, connection.vendor, len(columns))
    checks = _checks.get(key)
    if checks is None:
        quote = connection.ops.quote_name
        found = []
        for position, column in enumerate(columns):
            field = column.field
            if field.is_relation and field.remote_field.on_delete is models.SET_NULL:
                target = quote(field.target_field.column)
                table = quote(field.related_model._meta.db_table)
                found.append((position, f"(SELECT {target} FROM {table} WHERE {target} = {{}})"))
        checks = _checks[key] = tuple(found)
    return checks


@functools.lru_cache(maxsize=1024)
def _placeholders(start: int, count: int, checks: Checks = ()) -> str:
    """``($start+1, ..., $start+count)``: one row's, each of ``checks``' values through its
    subquery. A batch's rows start where the rows before them end, so the same few come back
    batch after batch."""
    marks = [f"${i}" for i in range(start + 1, start + count + 1)]
    for position, check in checks:
        marks[position] = check.format(marks[position])
    return "(" + ", ".join(marks) + ")"


@dataclass(frozen=True, slots=True)
class Touch:
    """A touch's ``UPDATE`` but its placeholders: the quoted table and columns, the time and
    the ids, prepared for ``connection``."""

    table: str
    column: str
    key: str
    now: Any
    ids: list[Any]


def touch_parts(ids: Iterable[Any], connection: BaseDatabaseWrapper) -> Touch:
    """``UPDATE table SET updated_at = now WHERE id in ids``, for conversations ``ids``."""
    quote = connection.ops.quote_name
    meta = Conversation._meta
    updated_at, pk = meta.get_field("updated_at"), meta.pk
    return Touch(
        table=quote(meta.db_table),
        column=quote(updated_at.column),
        key=quote(pk.column),
        now=updated_at.get_db_prep_save(timezone.now(), connection),
        ids=[pk.get_db_prep_value(i, connection) for i in ids],
    )


def _touch(ids: set[Any], connection: BaseDatabaseWrapper, params: list[Any]) -> str:
    """``UPDATE ... SET updated_at = now WHERE id = ANY(ids)``; its values added to ``params``."""
    touch = touch_parts(ids, connection)
    params += [touch.now, touch.ids]
    n = len(params)
    return f"UPDATE {touch.table} SET {touch.column} = ${n - 1} WHERE {touch.key} = ANY(${n})"


def _param_count(tables: Tables, connection: BaseDatabaseWrapper) -> int:
    count = 2 if tables.touch else 0
    for model, objs in _inserts(tables):
        count += len(objs) * len(insert_columns(model, objs, connection))
    return count


def _inserts(tables: Tables) -> list[tuple[type[models.Model], list[Row]]]:
    # Parents first, though the order of a statement's parts is PostgreSQL's to choose.
    found = [
        (Conversation, tables.conversations),
        (Message, tables.messages),
        (StreamRecord, tables.records),
    ]
    return [(model, objs) for model, objs in found if objs]


def batch_statement(
    tables: Tables, connection: BaseDatabaseWrapper
) -> tuple[str, list[Any]] | None:
    """The one statement storing ``tables`` and its parameters; None when there is nothing to
    store, or when it would take more parameters than PostgreSQL allows (thousands of answers
    in one batch: the caller stores them table by table then)."""
    if not (tables.conversations or tables.messages or tables.touch or tables.records):
        return None
    if _param_count(tables, connection) > MAX_PARAMS:
        return None
    params: list[Any] = []
    parts = [_insert(model, objs, connection, params) for model, objs in _inserts(tables)]
    if tables.touch:
        parts.append(_touch(tables.touch, connection, params))
    *first, last = parts
    if not first:
        return last, params
    withs = ", ".join(f"part{i} AS ({part})" for i, part in enumerate(first))
    return f"WITH {withs} {last}", params


def batch_statement_run(statement: tuple[str, list[Any]], connection: BaseDatabaseWrapper) -> None:
    """Run ``batch_statement``'s statement on ``connection`` (Django's, PostgreSQL); a refusal is
    Django's error (``IntegrityError``, ``OperationalError``, ...), as from its own cursor."""
    sql, params = statement
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.RawCursor(connection.connection) as cursor:
        cursor.execute(sql, params)
