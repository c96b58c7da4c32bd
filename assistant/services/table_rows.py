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
(PostgreSQL). ``tests/assistant/services/test_table_rows.py`` holds the rows each builder makes
against Django's own preparation of the same rows as model instances, on the backend it runs
on.
"""

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Column:
    """How one field's value in a row becomes the value bound to its column."""

    field: models.Field
    #: The row's key for it.
    name: str
    #: ``auto_now`` or ``auto_now_add``: the time the row is written, whatever the row says.
    now: bool
    #: The backend takes the row's value unchanged (no ``get_db_prep_save``).
    as_is: bool
    #: A callable default, called for each row that leaves the field out; else ``default``.
    default_call: Callable[[], Any] | None
    default: Any


def _column(field: models.Field, native: bool) -> Column:
    kind = (field.target_field if field.is_relation else field).get_internal_type()
    call = field.default if field.has_default() and callable(field.default) else None
    return Column(
        field=field,
        name=field.attname,
        now=bool(getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)),
        as_is=kind in (_AS_IS_NATIVE if native else _AS_IS),
        default_call=call,
        default=None if call is not None else field.get_default(),
    )


@functools.cache
def _columns(model: type[models.Model], native: bool, with_auto: bool) -> tuple[Column, ...]:
    auto = model._meta.auto_field
    return tuple(
        _column(f, native)
        for f in model._meta.concrete_fields
        if not f.generated and (with_auto or f is not auto)
    )


def _native(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "postgresql" and bool(connection.features.has_native_uuid_field)


def insert_columns(
    model: type[models.Model], rows: list[Row], connection: BaseDatabaseWrapper
) -> tuple[Column, ...]:
    """The columns ``rows`` are inserted with: every concrete field of ``model`` but a
    generated one, or an auto primary key none of them gives (left to the database: SQLite
    would take NULL as "next", PostgreSQL refuses it)."""
    auto = model._meta.auto_field
    with_auto = auto is not None and any(row.get(auto.attname) is not None for row in rows)
    return _columns(model, _native(connection), with_auto)


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
            values.append(
                value if column.as_is else column.field.get_db_prep_save(value, connection)
            )
        prepared.append(values)
    return prepared
