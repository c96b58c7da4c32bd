"""The indexes an answer's rows are written into: only those something reads.

- ``message.conversation_id`` had an index of its own beside ``(conversation_id, created_at)``,
  which serves every lookup by conversation too: dropped.
- ``streamrecord.owner_key`` had an index that nothing looks records up by: dropped.
- ``conversation.owner_key``, ``message.request_id`` and ``streamrecord.request_id`` were
  ``db_index=True``, with which PostgreSQL also keeps a ``varchar_pattern_ops`` index per column
  for ``LIKE 'prefix%'``, which nothing asks: dropped. Their plain indexes are now named in the
  models' ``Meta.indexes``: renamed where the database can (PostgreSQL), made again where it
  cannot (SQLite).

An answer (a new conversation, its two messages, its stream record) wrote 24 index entries on
PostgreSQL, 16 now; 18 on SQLite, 15 now.
"""

from typing import Any

from django.db import migrations, models

#: (model, column, the index ``db_index=True`` made, its name now)
_NAMED = [
    (
        "conversation",
        "owner_key",
        "assistant_conversation_owner_key_e05e4a23",
        "conversation_owner_key",
    ),
    ("message", "request_id", "assistant_message_request_id_b3c205cf", "message_request_id"),
    (
        "streamrecord",
        "request_id",
        "assistant_streamrecord_request_id_ecb21722",
        "stream_record_request_id",
    ),
]
#: (model, column, the index dropped, whether the column is text: PostgreSQL's ``LIKE`` index)
_DROPPED = [
    ("message", "conversation_id", "assistant_message_conversation_id_37580ec3", False),
    ("streamrecord", "owner_key", "assistant_streamrecord_owner_key_f7240cd4", True),
]


def _indexes(schema_editor: Any, table: str) -> set[str]:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))


def _table(apps: Any, model: str) -> str:
    return apps.get_model("assistant", model)._meta.db_table


def _like_create(schema_editor: Any, table: str, column: str, index: str) -> None:
    """PostgreSQL's ``LIKE`` index beside ``index``, as ``db_index=True`` makes it."""
    quote = schema_editor.quote_name
    schema_editor.execute(
        f"CREATE INDEX {quote(index + '_like')} ON {quote(table)} "
        f"({quote(column)} varchar_pattern_ops)"
    )


def _forwards(apps: Any, schema_editor: Any) -> None:
    quote, postgresql = schema_editor.quote_name, schema_editor.connection.vendor == "postgresql"
    for model, column, old, new in _NAMED:
        table = _table(apps, model)
        schema_editor.execute(f"DROP INDEX IF EXISTS {quote(old + '_like')}")
        found = _indexes(schema_editor, table)
        if new in found:
            continue
        if old in found and postgresql:
            schema_editor.execute(f"ALTER INDEX {quote(old)} RENAME TO {quote(new)}")
            continue
        schema_editor.execute(f"DROP INDEX IF EXISTS {quote(old)}")
        schema_editor.execute(f"CREATE INDEX {quote(new)} ON {quote(table)} ({quote(column)})")
    for _model, _column, old, text in _DROPPED:
        schema_editor.execute(f"DROP INDEX IF EXISTS {quote(old)}")
        if text:
            schema_editor.execute(f"DROP INDEX IF EXISTS {quote(old + '_like')}")


def _backwards(apps: Any, schema_editor: Any) -> None:
    quote, postgresql = schema_editor.quote_name, schema_editor.connection.vendor == "postgresql"
    for model, column, old, new in _NAMED:
        table = _table(apps, model)
        if postgresql:
            schema_editor.execute(f"ALTER INDEX {quote(new)} RENAME TO {quote(old)}")
            _like_create(schema_editor, table, column, old)
        else:
            schema_editor.execute(f"DROP INDEX {quote(new)}")
            schema_editor.execute(f"CREATE INDEX {quote(old)} ON {quote(table)} ({quote(column)})")
    for model, column, old, text in _DROPPED:
        table = _table(apps, model)
        schema_editor.execute(f"CREATE INDEX {quote(old)} ON {quote(table)} ({quote(column)})")
        if text and postgresql:
            _like_create(schema_editor, table, column, old)


class Migration(migrations.Migration):
    dependencies = [
        ("assistant", "0013_ordered_ids"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="conversation",
                    name="owner_key",
                    field=models.CharField(max_length=80),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="conversation",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="messages",
                        to="assistant.conversation",
                    ),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="request_id",
                    field=models.CharField(blank=True, max_length=64),
                ),
                migrations.AlterField(
                    model_name="streamrecord",
                    name="owner_key",
                    field=models.CharField(max_length=80),
                ),
                migrations.AlterField(
                    model_name="streamrecord",
                    name="request_id",
                    field=models.CharField(max_length=64),
                ),
                migrations.AddIndex(
                    model_name="conversation",
                    index=models.Index(fields=["owner_key"], name="conversation_owner_key"),
                ),
                migrations.AddIndex(
                    model_name="message",
                    index=models.Index(fields=["request_id"], name="message_request_id"),
                ),
                migrations.AddIndex(
                    model_name="streamrecord",
                    index=models.Index(fields=["request_id"], name="stream_record_request_id"),
                ),
            ],
            database_operations=[migrations.RunPython(_forwards, _backwards)],
        )
    ]
