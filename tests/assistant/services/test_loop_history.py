"""A continued conversation's history read by the event loop's own PostgreSQL connection
(``assistant/loop_postgres.py``, ``conversations.history_on_loop``), on the real PostgreSQL the
suite runs on: the same messages as the ORM's read on a thread, in batches, on the server's loop
only, and a lost connection sent to the thread then opened again.

The loop's connection is PostgreSQL's only (it is psycopg's, with Django's settings): on the
local profile's SQLite these tests have nothing to read, and the thread reads as before there.
"""

import asyncio
import os
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from assistant import loop_postgres
from assistant.db import run_db
from assistant.engines import ChatMessage
from assistant.ids import ordered_uuid
from assistant.lifespan import worker_stopping
from assistant.loop_postgres import LoopReads, loop_reads
from assistant.models import Classroom, Conversation, Message
from assistant.services.conversations import (
    ConversationNotFound,
    conversation_history,
    history_on_loop,
)
from assistant.services.table_rows import Row

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the loop's connection sees what is committed
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the loop's reads are PostgreSQL's"
    ),
]

OWNER = "session:owner"


@pytest.fixture
async def reads(server_loop: None) -> LoopReads:
    """The server loop's reads (this test's loop; closed after it by ``server_loop``)."""
    found = loop_reads()
    assert found is not None
    return found


def a_conversation(
    classroom: Classroom | None, messages: list[tuple[str, str]], *, owner: str = OWNER
) -> uuid.UUID:
    """A conversation of ``owner`` with ``messages`` (role, content) a second apart, oldest
    first; a content of ``"replaced:..."`` is stored replaced."""
    conversation = Conversation.objects.create(owner_key=owner, classroom=classroom, title="t")
    start = timezone.now() - timedelta(hours=1)
    for i, (role, content) in enumerate(messages):
        replaced = content.startswith("replaced:")
        message = Message.objects.create(
            conversation=conversation,
            role=role,
            content=content,
            replaced_at=start if replaced else None,
        )
        # auto_now_add: the times are set apart after
        Message.objects.filter(pk=message.pk).update(created_at=start + timedelta(seconds=i))
    return conversation.pk


def on_thread(
    classroom_id: uuid.UUID | None, conversation_id: uuid.UUID, limit: int, held: Sequence[Row] = ()
) -> Any:
    return run_db(
        conversation_history,
        owner_key=OWNER,
        classroom_id=classroom_id,
        conversation_id=conversation_id,
        limit=limit,
        held=held,
    )


async def on_loop(
    classroom_id: uuid.UUID | None,
    conversation_id: uuid.UUID,
    limit: int,
    owner: str = OWNER,
    held: Sequence[Row] = (),
) -> list[ChatMessage] | None:
    reading = history_on_loop(
        owner_key=owner,
        classroom_id=classroom_id,
        conversation_id=conversation_id,
        limit=limit,
        held=held,
    )
    assert reading is not None
    return await reading


MESSAGES = [
    ("user", "一 first question"),
    ("assistant", "first answer"),
    ("user", "replaced:asked again"),
    ("assistant", "replaced:its answer"),
    ("user", "second question 'quoted' \\ %s"),
    ("assistant", ""),  # an answer that failed before any text
    ("user", "third question"),
    ("assistant", "third answer **粗体**"),
]


async def test_the_loops_history_is_the_threads(reads: LoopReads) -> None:
    classroom = await run_db(Classroom.objects.create, name="7B")
    in_class = await run_db(a_conversation, classroom, MESSAGES)
    in_none = await run_db(a_conversation, None, MESSAGES[:5])
    empty = await run_db(a_conversation, None, [])
    for class_id, conversation in ((classroom.pk, in_class), (None, in_none), (None, empty)):
        for limit in (1, 2, 3, 50):
            expected = await on_thread(class_id, conversation, limit)
            assert await on_loop(class_id, conversation, limit) == expected, (conversation, limit)
    assert [m.content for m in await on_loop(classroom.pk, in_class, 50) or []] == [
        "一 first question",
        "first answer",
        "second question 'quoted' \\ %s",
        "third question",
        "third answer **粗体**",
    ]
    assert await on_loop(None, empty, 20) == []


async def test_both_reads_are_completed_alike_with_what_the_writer_holds(
    reads: LoopReads,
) -> None:
    """Messages the group writer holds (``conversations.history_held``): one stored meanwhile
    (in the read already), one not, one empty: the loop's read and the thread's agree at every
    limit, each message once; another owner's read still finds nothing."""
    conversation = await run_db(a_conversation, None, MESSAGES[:2])
    last = await run_db(Message.objects.filter(content="first answer").get)

    def held_row(key: uuid.UUID, role: str, content: str) -> Row:
        return {"id": key, "conversation_id": conversation, "role": role, "content": content}

    held = [
        held_row(last.pk, "assistant", "first answer"),
        held_row(ordered_uuid(), "user", "held question"),
        held_row(ordered_uuid(), "assistant", ""),
    ]
    for limit in (1, 2, 3, 50):
        expected = await on_thread(None, conversation, limit, held)
        assert await on_loop(None, conversation, limit, held=held) == expected, limit
    assert [m.content for m in await on_loop(None, conversation, 50, held=held) or []] == [
        "一 first question",
        "first answer",
        "held question",
    ]
    assert await on_loop(None, conversation, 50, "session:another", held) is None


async def test_a_conversation_not_the_askers_is_left_to_the_thread(reads: LoopReads) -> None:
    """None: the thread reads it again and refuses it (``ConversationNotFound``, a 404)."""
    classroom = await run_db(Classroom.objects.create, name="7B")
    in_class = await run_db(a_conversation, classroom, MESSAGES[:2])
    in_none = await run_db(a_conversation, None, MESSAGES[:2])
    assert await on_loop(classroom.pk, in_class, 20) is not None
    assert await on_loop(classroom.pk, in_class, 20, owner="session:another") is None
    assert await on_loop(None, in_class, 20) is None  # asked from no class
    assert await on_loop(classroom.pk, in_none, 20) is None  # asked from a class
    assert await on_loop(None, uuid.uuid4(), 20) is None
    with pytest.raises(ConversationNotFound):
        await run_db(
            conversation_history,
            owner_key="session:another",
            classroom_id=classroom.pk,
            conversation_id=in_class,
            limit=20,
        )


async def test_reads_asked_together_go_in_one_batch(reads: LoopReads) -> None:
    conversations = [
        await run_db(a_conversation, None, [("user", f"q{i}"), ("assistant", f"a{i}")])
        for i in range(3)
    ]
    assert await on_loop(None, conversations[0], 20) is not None  # connected
    batches, done = reads.batches, reads.reads
    found = await asyncio.gather(*(on_loop(None, c, 20) for c in conversations * 10))
    assert [[m.content for m in history or []] for history in found] == [
        [f"q{i}", f"a{i}"] for i in range(3)
    ] * 10
    assert reads.reads - done == 30
    assert reads.batches - batches == 1


async def test_a_lost_connection_goes_to_the_thread_then_is_opened_again(
    reads: LoopReads,
) -> None:
    conversation = await run_db(a_conversation, None, MESSAGES[:2])
    assert await on_loop(None, conversation, 20) is not None
    application = f"chatsite-loop-{os.getpid()}"
    with psycopg.connect(**loop_postgres._connection_params() or {}, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application,),
        ).fetchall()
    assert ended == [(True,)]
    assert await on_loop(None, conversation, 20) is None  # that batch failed: to the thread
    assert [m.content for m in await on_loop(None, conversation, 20) or []] == [
        "一 first question",
        "first answer",
    ]


async def test_a_database_that_stops_answering_sends_the_reads_to_a_thread(
    reads: LoopReads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that takes longer than ``BATCH_TIMEOUT_S`` fails (its reads go to a thread),
    and the next goes on a connection opened again."""
    monkeypatch.setattr(loop_postgres, "BATCH_TIMEOUT_S", 0.5)
    conversation = await run_db(a_conversation, None, MESSAGES[:2])
    hung = reads.rows("SELECT pg_sleep(5)", ())
    with pytest.raises(TimeoutError):
        await hung
    assert [m.content for m in await on_loop(None, conversation, 20) or []] == [
        "一 first question",
        "first answer",
    ]


async def test_only_the_servers_loop_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop of no server (a management command's, a test's own) has no connection: the
    thread reads, and nothing is left open when that loop ends."""
    monkeypatch.setattr(loop_postgres, "_state", loop_postgres._LoopDatabase())
    assert loop_reads() is None
    conversation = await run_db(a_conversation, None, MESSAGES[:2])
    reading = history_on_loop(
        owner_key=OWNER, classroom_id=None, conversation_id=conversation, limit=20
    )
    assert reading is None


async def test_a_stopping_worker_closes_the_connection(server_loop: None) -> None:
    conversation = await run_db(a_conversation, None, MESSAGES[:2])
    assert await on_loop(None, conversation, 20) is not None
    application = f"chatsite-loop-{os.getpid()}"

    def named() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [application],
            )
            return cursor.fetchone()[0]

    assert await run_db(named) == 1
    await worker_stopping()
    assert loop_reads() is None
    assert await run_db(named) == 0
