"""A group writer's batch stored table by table through Django's connection: one statement per
table, in the caller's transaction (``persistence.rows_write``). SQLite's way, and PostgreSQL's
for what one statement (``batch_statement``) does not take: a batch too large for it, and the
questions a batch sets aside.
"""

import uuid

from django.db import connections, models, router
from django.db.models import Subquery
from django.utils import timezone

from assistant.models import Classroom, Conversation, Message, StreamRecord
from assistant.services.batch_statement import Tables, touch_parts
from assistant.services.table_rows import Row, insert_head, insert_values


def insert_many(model: type[models.Model], objs: list[Row]) -> None:
    """INSERT the rows ``objs`` of ``model`` with one prepared statement, as ``bulk_create``
    would store them (SQLite's writer, and PostgreSQL's for a batch too large for one
    statement: ``batch_statement``).

    ``bulk_create`` compiles its SQL anew on every call, which costs more CPU than SQLite or
    PostgreSQL spend storing a row. Values are prepared the same way (``table_rows``); no
    signals are sent, as with ``bulk_create``.
    """
    connection = connections[router.db_for_write(model)]
    fields, head = insert_head(model, objs, connection)
    placeholders = ", ".join(["%s"] * len(fields))
    sql = f"{head} VALUES ({placeholders})"
    with connection.cursor() as cursor:
        cursor.executemany(sql, insert_values(fields, objs, connection))


def conversations_touch(ids: set[uuid.UUID]) -> None:
    """``UPDATE ... SET updated_at = now WHERE id IN ids``, prepared like ``insert_many``."""
    connection = connections[router.db_for_write(Conversation)]
    touch = touch_parts(ids, connection)
    placeholders = ", ".join(["%s"] * len(touch.ids))
    sql = f"UPDATE {touch.table} SET {touch.column} = %s WHERE {touch.key} IN ({placeholders})"
    with connection.cursor() as cursor:
        cursor.execute(sql, [touch.now, *touch.ids])


def messages_replace(*, conversation_id: uuid.UUID, first: uuid.UUID, keep: uuid.UUID) -> None:
    """Set aside message ``first`` of the conversation and every message after it but ``keep``
    (an edited or regenerated question, and its replacement): kept, with the time they were
    replaced. Run after the batch's inserts, so that the replaced question's own answer is set
    aside too when it is stored in the same batch as its replacement."""
    since = Message.objects.filter(id=first, conversation_id=conversation_id).values("created_at")
    Message.objects.filter(
        conversation_id=conversation_id,
        replaced_at__isnull=True,
        created_at__gte=Subquery(since[:1]),
    ).exclude(id=keep).update(replaced_at=timezone.now())


def classes_gone(conversations: list[Row]) -> None:
    """New conversations whose class was deleted since the question was asked are stored in no
    class, as the class's others were (``SET_NULL``), rather than refused with what was said.
    One query, only when some conversation has a class; for the rows stored table by table
    (PostgreSQL's one statement checks them itself: ``batch_statement._set_null_checks``)."""
    wanted = {c["classroom_id"] for c in conversations if c.get("classroom_id") is not None}
    if not wanted:
        return
    existing = set(Classroom.objects.filter(id__in=wanted).values_list("id", flat=True))
    for conversation in conversations:
        if conversation.get("classroom_id") not in existing:
            conversation["classroom_id"] = None


def tables_write(tables: Tables) -> None:
    """One statement per table, in the caller's transaction."""
    if tables.conversations:
        insert_many(Conversation, tables.conversations)
    if tables.messages:
        insert_many(Message, tables.messages)
    if tables.touch:
        conversations_touch(tables.touch)
    if tables.records:
        insert_many(StreamRecord, tables.records)
