"""The indexes an answer's rows are written into are those something reads (migration 0014):
one per column looked up, none that another index already serves."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

#: The columns an answer's rows are looked up by, each with one index of its own.
LOOKED_UP = [
    ("assistant_conversation", "owner_key"),
    ("assistant_message", "request_id"),
    ("assistant_streamrecord", "request_id"),
]
#: Columns with no index of their own: another serves them, or nothing looks rows up by them.
NOT_LOOKED_UP = [("assistant_message", "conversation_id"), ("assistant_streamrecord", "owner_key")]
BEFORE = ("assistant", "0013_ordered_ids")


def indexes_on(table: str, columns: list[str]) -> int:
    """How many indexes of ``table``, unique ones and the primary key left out, are on exactly
    ``columns``."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return sum(
        1
        for constraint in found.values()
        if constraint["index"]
        and not constraint["unique"]
        and not constraint["primary_key"]
        and constraint["columns"] == columns
    )


def migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())


def test_each_column_looked_up_has_one_index_and_none_is_served_twice() -> None:
    for table, column in LOOKED_UP:
        assert indexes_on(table, [column]) == 1, (table, column)
    assert indexes_on("assistant_message", ["conversation_id", "created_at"]) == 1
    for table, column in NOT_LOOKED_UP:
        assert indexes_on(table, [column]) == 0, (table, column)


def test_the_migration_goes_back_to_the_indexes_before_and_forward_again() -> None:
    # PostgreSQL kept a second index per text column (for LIKE 'prefix%'); SQLite did not.
    kept_before = 2 if connection.vendor == "postgresql" else 1
    try:
        migrate([BEFORE])
        for table, column in [*LOOKED_UP, ("assistant_streamrecord", "owner_key")]:
            assert indexes_on(table, [column]) == kept_before, (table, column)
        assert indexes_on("assistant_message", ["conversation_id"]) == 1
    finally:
        migrate()
    for table, column in LOOKED_UP:
        assert indexes_on(table, [column]) == 1, (table, column)
    for table, column in NOT_LOOKED_UP:
        assert indexes_on(table, [column]) == 0, (table, column)
