"""The group writer's rows: a model's field values in a plain dict, made on the event loop and
prepared for the database on the writer's thread, with no model instance.

An answer stores three or four rows (its question, its answer, its record, and a new
conversation), and as model instances they cost more than the rest of the answer's end: Django's
``Model.__init__`` runs once per row on the event loop (17 µs for a ``StreamRecord``), and
``bulk_create``'s preparation calls each field's ``pre_save`` and ``get_db_prep_save`` on the
writer's thread (0.8 µs a field, 33 fields a record). Here a row is a dict keyed by the fields'
attribute names (``conversation_id``, not ``conversation``); a field the row leaves out gets its
default, as ``Model.__init__`` would give it, and an ``auto_now``/``auto_now_add`` field the
time it is written, as ``pre_save`` would. Each value is then prepared as ``get_db_prep_save``
prepares it, except where that returns the value unchanged: strings, floats and booleans on
every backend, and UUIDs and aware datetimes where the backend takes them as they are
(PostgreSQL). On SQLite a UUID is bound as its hex, an aware datetime as its naive text in
the connection's time zone, and an int or None as it is, as Django's preparation ends up binding
them, without the calls it takes to get there (five for a datetime).
``tests/assistant/services/test_table_rows.py`` holds the rows each builder makes against
Django's own preparation of the same rows as model instances, on the backend it runs on, and
SQLite's bindings against Django's on a SQLite connection.
"""

import functools
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

#: One row: a model's field values, keyed by the fields' attribute names.
type Row = dict[str, Any]

#: Field types whose ``get_db_prep_save`` returns a value of the right Python type unchanged,
#: on every backend. (Not integers: on PostgreSQL Django binds them as psycopg's ``Int4`` and
#: its kin, sized to the column.)
_AS_IS = frozenset({"CharField", "TextField", "FloatField", "BooleanField"})
#: ... and on a backend with native UUIDs and time zones (PostgreSQL).
_AS_IS_NATIVE = _AS_IS | {"UUIDField", "DateTimeField"}

#: A value's preparation for a connection; None in a ``Column``: the value as it is.
type Prepare = Callable[[Any, BaseDatabaseWrapper], Any]


@dataclass(frozen=True, slots=True)
class Column:
    """How one field's value in a row becomes the value bound to its column."""

    field: models.Field
    #: The row's key for it.
    name: str
    #: ``auto_now`` or ``auto_now_add``: the time the row is written, whatever the row says.
    now: bool
    #: What the value goes through (None: the backend takes it unchanged).
    prepare: Prepare | None
    #: A callable default, called for each row that leaves the field out; else ``default``.
    default_call: Callable[[], Any] | None
    default: Any


def _sqlite_uuid(prepare: Prepare) -> Prepare:
    """A UUID as SQLite's columns hold it (its hex), None as NULL; anything else as Django
    prepares it."""

    def hexed(value: Any, connection: BaseDatabaseWrapper) -> Any:
        if type(value) is uuid.UUID:
            return value.hex
        return None if value is None else prepare(value, connection)

    return hexed


def _sqlite_datetime(prepare: Prepare) -> Prepare:
    """An aware datetime as SQLite's columns hold it (naive, in the connection's time zone, as
    text), None as NULL; anything else (a naive one, which Django warns of, or any with time
    zones off: the connection has no time zone then) as Django prepares it. One already in the
    connection's time zone (``timezone.now()``'s, UTC, on a connection in UTC) is not converted
    to it again."""

    def naive(value: Any, connection: BaseDatabaseWrapper) -> Any:
        if type(value) is datetime and (zone := connection.timezone) is not None:
            if value.tzinfo is zone:
                return str(value.replace(tzinfo=None))
            if value.utcoffset() is not None:
                return str(value.astimezone(zone).replace(tzinfo=None))
        return None if value is None else prepare(value, connection)

    return naive


def _sqlite_integer(prepare: Prepare) -> Prepare:
    """An int (not a bool) or None as it is; anything else as Django prepares it."""

    def whole(value: Any, connection: BaseDatabaseWrapper) -> Any:
        return value if type(value) is int or value is None else prepare(value, connection)

    return whole


#: How SQLite's values are bound without Django's preparation, by field type.
_SQLITE: dict[str, Callable[[Prepare], Prepare]] = {
    "UUIDField": _sqlite_uuid,
    "DateTimeField": _sqlite_datetime,
    **dict.fromkeys(
        [
            "IntegerField",
            "BigIntegerField",
            "SmallIntegerField",
            "PositiveIntegerField",
            "PositiveBigIntegerField",
            "PositiveSmallIntegerField",
        ],
        _sqlite_integer,
    ),
}


def _prepare(field: models.Field, kind: str, backend: str) -> Prepare | None:
    if kind in (_AS_IS_NATIVE if backend == "native" else _AS_IS):
        return None
    if backend == "sqlite" and kind in _SQLITE:
        return _SQLITE[kind](field.get_db_prep_save)
    return field.get_db_prep_save


def _column(field: models.Field, backend: str) -> Column:
    kind = (field.target_field if field.is_relation else field).get_internal_type()
    call = field.default if field.has_default() and callable(field.default) else None
    return Column(
        field=field,
        name=field.attname,
        now=bool(getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)),
        prepare=_prepare(field, kind, backend),
        default_call=call,
        default=None if call is not None else field.get_default(),
    )


@functools.cache
def _columns(model: type[models.Model], backend: str, with_auto: bool) -> tuple[Column, ...]:
    auto = model._meta.auto_field
    return tuple(
        _column(f, backend)
        for f in model._meta.concrete_fields
        if not f.generated and (with_auto or f is not auto)
    )


def _backend(connection: BaseDatabaseWrapper) -> str:
    """``native`` (PostgreSQL: UUIDs and aware datetimes as they are), ``sqlite``, or
    ``other`` (every value through Django's preparation)."""
    if connection.vendor == "postgresql" and connection.features.has_native_uuid_field:
        return "native"
    return "sqlite" if connection.vendor == "sqlite" else "other"


def _with_auto(model: type[models.Model], rows: list[Row]) -> bool:
    auto = model._meta.auto_field
    return auto is not None and any(row.get(auto.attname) is not None for row in rows)


def insert_columns(
    model: type[models.Model], rows: list[Row], connection: BaseDatabaseWrapper
) -> tuple[Column, ...]:
    """The columns ``rows`` are inserted with: every concrete field of ``model`` but a
    generated one, or an auto primary key none of them gives (left to the database: SQLite
    would take NULL as "next", PostgreSQL refuses it)."""
    return _columns(model, _backend(connection), _with_auto(model, rows))


#: ``INSERT INTO table (columns)`` by model, vendor (whose quoting it is) and whether the auto
#: primary key is among the columns: the same few for the life of the process.
_heads: dict[tuple[type[models.Model], str, bool], str] = {}


def insert_head(
    model: type[models.Model], rows: list[Row], connection: BaseDatabaseWrapper
) -> tuple[tuple[Column, ...], str]:
    """``insert_columns``' columns and ``INSERT INTO table (columns)`` for them, quoted for
    ``connection``: made once, not quoted and joined again column by column for every batch."""
    with_auto = _with_auto(model, rows)
    columns = _columns(model, _backend(connection), with_auto)
    key = (model, connection.vendor, with_auto)
    head = _heads.get(key)
    if head is None:
        quote = connection.ops.quote_name
        names = ", ".join(quote(c.field.column) for c in columns)
        head = _heads[key] = f"INSERT INTO {quote(model._meta.db_table)} ({names})"
    return columns, head


def insert_values(
    columns: tuple[Column, ...], rows: Iterable[Row], connection: BaseDatabaseWrapper
) -> list[list[Any]]:
    """Each row's values for ``columns``, prepared as ``bulk_create`` prepares a model
    instance's."""
    prepared = []
    for row in rows:
        values = []
        for column in columns:
            if column.now:
                value = timezone.now()
            elif column.name in row:
                value = row[column.name]
            elif column.default_call is not None:
                value = column.default_call()
            else:
                value = column.default
            prepare = column.prepare
            values.append(value if prepare is None else prepare(value, connection))
        prepared.append(values)
    return prepared
