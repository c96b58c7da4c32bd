"""A new question admitted by the event loop's own Redis client (``services/loop_admission.py``)
on the production profile's cache, slots and sessions in the real Redis at 127.0.0.1:6379 (under
a prefix of each test's own): no trip to a database thread where the loop can tell, and the
thread's answer, unchanged, wherever it cannot; a class changed or deleted in another process is
read again."""

import asyncio
import functools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.contrib.sessions.backends.cached_db import SessionStore
from django.db import connection

from assistant import errors, loop_postgres, loop_redis
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.loop_postgres import loop_reads
from assistant.models import Classroom, Conversation, Message
from assistant.services import answer_open, classrooms
from assistant.services.answer_open import Asking, _admission
from assistant.services.answer_start import _page_admitted
from assistant.services.chat_request import ChatTurn
from assistant.services.class_versions import version_stamp
from assistant.services.classrooms import SESSION_CLASS, class_context_load
from assistant.services.conversations import ConversationNotFound
from assistant.services.identity import Identity, owner_key_for
from assistant.services.loop_admission import page_admission_on_loop
from assistant.services.stream_slots import CLASS_GONE, RedisSlots
from tests.support import REDIS_URL, thread_trips

# Sessions and classes in the database beside the cache; versions written once committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slots(redis_slots: RedisSlots, settings: Any, monkeypatch: pytest.MonkeyPatch) -> RedisSlots:
    """The production profile's cache, sessions and slots (one stream at a time)."""
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
    monkeypatch.setattr(classrooms, "_known", {})  # nothing read in this process yet
    return redis_slots


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The admissions sent to a database thread."""
    return thread_trips(monkeypatch, answer_open)


@pytest.fixture
def raw(redis_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def a_session(classroom: Classroom | None = None, **data: object) -> str:
    """A page's session, saved (in the database and the cache), in ``classroom`` if given."""
    session = SessionStore()
    session["created"] = True
    if classroom is not None:
        session[SESSION_CLASS] = str(classroom.pk)
    for key, value in data.items():
        session[key] = value
    session.save()
    assert session.session_key is not None
    return session.session_key


def turn(classroom: Classroom | None = None, conversation: uuid.UUID | None = None) -> ChatTurn:
    shown = None if classroom is None else (classroom.pk, classroom.teachers_read)
    return ChatTurn(message="hi", conversation_id=conversation, replaces=None, shown=shown)


def admission(session_key: str, asked: ChatTurn, request_id: str) -> "asyncio.Future[Any]":
    """The page's admission of ``asked`` as ``answer_start`` describes it."""
    asking = Asking(
        question=asked.message,
        conversation_id=asked.conversation_id,
        replaces=asked.replaces,
        held=None,
        admit=functools.partial(_page_admitted, session_key, asked, request_id),
        prompt=lambda history, classroom: [],
        owner=lambda: None,  # type: ignore[arg-type,return-value]
        admit_on_loop=lambda: page_admission_on_loop(
            session_key, asked.conversation_id, asked.replaces, asked.shown, request_id
        ),
    )
    return _admission(asking)


def rate_counts(raw: redis.Redis, prefix: str) -> int:
    return sum(int(raw.get(key) or 0) for key in raw.scan_iter(match=f"{prefix}:*ratelimit:chat*"))


def holders(store: RedisSlots, owner_key: str) -> tuple[str, ...]:
    tried = store.take(owner_key, "probe", limit=1, ttl_s=60)
    if tried.taken:
        store.release(owner_key, "probe")
    return tried.holders


async def test_a_class_read_here_is_admitted_by_the_loops_client(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    classroom = await run_db(Classroom.objects.create, name="7B", join_code="LOOPAD", chat_rate=30)
    key = await run_db(a_session, classroom)
    version_key = f"{redis_prefix}:chat:class:{classroom.pk}:version"
    assert raw.get(version_key) == version_stamp(classroom.updated_at).encode()  # its save's
    raw.delete(version_key)  # lapsed, or Redis lost it
    # Not read in this process yet: the thread reads it, and keeps its version in Redis again.
    first, slot, _ = await admission(key, turn(classroom), "r1")
    assert slot.taken and first.classroom is not None and hops == ["_page_admitted"]
    assert raw.get(version_key) == version_stamp(classroom.updated_at).encode()
    await slots_give_back(slots, first.owner_key, "r1")

    again, slot, history = await admission(key, turn(classroom), "r2")
    assert hops == ["_page_admitted"]  # no second trip
    assert (again, slot.taken, history) == (first, True, [])
    assert holders(slots, first.owner_key) == ("r2",)
    assert rate_counts(raw, redis_prefix) == 2  # counted there as on the thread


async def slots_give_back(store: RedisSlots, owner_key: str, request_id: str) -> None:
    assert await store.release_on_loop(owner_key, request_id)


async def test_a_student_of_no_class_is_admitted_by_the_loops_client(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    key = await run_db(a_session)
    identity, slot, _ = await admission(key, turn(), "r1")
    assert (identity.classroom, slot.taken, hops) == (None, True, [])
    assert identity == (await run_db(_page_admitted, key, turn(), "r1"))[0]


async def test_a_class_changed_in_another_process_is_read_again(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    classroom = await run_db(
        Classroom.objects.create, name="7B", join_code="LOOPAC", persona="Be brief."
    )
    key = await run_db(a_session, classroom)
    first, _, _ = await admission(key, turn(classroom), "r1")
    await slots_give_back(slots, first.owner_key, "r1")
    counted = rate_counts(raw, redis_prefix)

    # Another worker's teacher changes the persona: this process's read is now old.
    await run_db(_persona, classroom.pk, "Answer in Chinese.")
    on_loop = page_admission_on_loop(key, None, None, turn(classroom).shown, "r2")
    assert on_loop is not None
    assert await on_loop is None  # nothing counted, nothing taken
    assert (rate_counts(raw, redis_prefix), holders(slots, first.owner_key)) == (counted, ())

    again, slot, _ = await admission(key, turn(classroom), "r2")
    assert again.classroom is not None and again.classroom.persona == "Answer in Chinese."
    assert slot.taken and hops == ["_page_admitted", "_page_admitted"]
    await slots_give_back(slots, first.owner_key, "r2")
    # Read again here: the loop's again.
    assert (await admission(key, turn(classroom), "r3"))[0] == again
    assert hops == ["_page_admitted", "_page_admitted"]


def _persona(class_id: uuid.UUID, persona: str) -> None:
    row = Classroom.objects.get(pk=class_id)
    row.persona = persona
    row.save(update_fields=["persona", "updated_at"])


async def test_a_read_older_than_a_change_never_replaces_its_version(
    slots: RedisSlots, server_loop: None, raw: redis.Redis, redis_prefix: str
) -> None:
    """A thread that read the class before a change committed keeps the change's version."""
    classroom = await run_db(Classroom.objects.create, name="7B", join_code="LOOPAO")
    old = await run_db(class_context_load, str(classroom.pk))
    await run_db(_persona, classroom.pk, "Changed.")
    key = await run_db(a_session, classroom)
    version_key = f"{redis_prefix}:chat:class:{classroom.pk}:version"
    changed = raw.get(version_key)
    assert changed is not None and changed != version_stamp(classroom.updated_at).encode()

    from assistant.services.answer_start import _admitted

    assert (await run_db(_admitted, _identity(key, old), "r1", None)).taken
    assert raw.get(version_key) == changed
    # This process holds the old read: its loop does not answer from it.
    on_loop = page_admission_on_loop(key, None, None, None, "r2")
    assert on_loop is not None and await on_loop is None


def _identity(session_key: str, context: Any) -> Any:
    return Identity(owner_key=owner_key_for(None, session_key), classroom=context)


async def test_a_deleted_class_is_read_again(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    classroom = await run_db(Classroom.objects.create, name="7B", join_code="LOOPAX")
    key = await run_db(a_session, classroom)
    first, _, _ = await admission(key, turn(classroom), "r1")
    await slots_give_back(slots, first.owner_key, "r1")
    await run_db(Classroom.objects.filter(pk=classroom.pk).delete)
    assert raw.get(f"{redis_prefix}:chat:class:{classroom.pk}:version") == CLASS_GONE.encode()

    # The page still shows the class it had: the thread says the class is not the one shown.
    with pytest.raises(Rejected) as refused:
        await admission(key, turn(classroom), "r2")
    assert refused.value.error is errors.CLASS_CHANGED
    assert hops == ["_page_admitted", "_page_admitted"]


async def test_what_the_loop_cannot_tell_goes_to_a_thread(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    user = await run_db(User.objects.create, username="teacher")
    logged_in = await run_db(functools.partial(a_session, _auth_user_id=str(user.pk)))
    evicted = await run_db(a_session)
    raw.delete(*raw.scan_iter(match=f"{redis_prefix}:*cached_db{evicted}"))
    paused = await run_db(Classroom.objects.create, name="7C", join_code="LOOPAP", paused=True)
    in_paused = await run_db(a_session, paused)
    await run_db(class_context_load, str(paused.pk))  # read here: known, paused
    for key in (logged_in, evicted):
        on_loop = page_admission_on_loop(key, None, None, None, "r1")
        assert on_loop is not None and await on_loop is None
    with pytest.raises(Rejected) as refused:
        await admission(in_paused, turn(paused), "r2")
    assert refused.value.error is errors.CLASS_PAUSED
    assert hops == ["_page_admitted"]
    assert rate_counts(raw, redis_prefix) == 0


@pytest.mark.parametrize("shown", [None, (None, False)], ids=["read-first", "shown"])
async def test_over_the_rate_on_the_loop_is_429(
    slots: RedisSlots, server_loop: None, hops: list[str], settings: Any, shown: Any
) -> None:
    settings.CHATSITE_RATE_LIMITS = {**settings.CHATSITE_RATE_LIMITS, "chat": (1, 60)}
    key = await run_db(a_session)
    asked = ChatTurn(message="hi", conversation_id=None, shown=shown)
    identity, _, _ = await admission(key, asked, "r1")
    await slots_give_back(slots, identity.owner_key, "r1")
    with pytest.raises(Rejected) as refused:
        await admission(key, asked, "r2")
    assert refused.value.error is errors.RATE_LIMITED and refused.value.retry_after
    assert hops == []


@pytest.mark.parametrize("shown", [None, (None, False)], ids=["read-first", "shown"])
async def test_a_redis_that_forgot_the_scripts_is_sent_them_by_the_loop(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, shown: Any
) -> None:
    """Its text sent once where Redis has not got it (it restarted, or its scripts were
    flushed), then its digest again; a page that did not say what it showed is read first."""
    key = await run_db(a_session)
    raw.script_flush()
    asked = ChatTurn(message="hi", conversation_id=None, shown=shown)
    identity, slot, _ = await admission(key, asked, "r1")
    assert slot.taken and hops == []
    await slots_give_back(slots, identity.owner_key, "r1")
    commands = loop_redis._state.clients[REDIS_URL]
    before = commands.commands
    assert (await admission(key, asked, "r2"))[1].taken
    assert commands.commands - before == (2 if shown is None else 1)


async def test_a_loop_that_is_not_a_servers_admits_on_a_thread(
    slots: RedisSlots, hops: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_redis, "_state", loop_redis._LoopClients())
    key = await run_db(a_session)
    assert page_admission_on_loop(key, None, None, None, "r1") is None
    _, slot, _ = await admission(key, turn(), "r1")
    assert slot.taken and hops == ["_page_admitted"]


POSTGRES = connection.vendor == "postgresql"


def a_conversation_of(owner_key: str, classroom: Classroom | None) -> uuid.UUID:
    conversation = Conversation.objects.create(owner_key=owner_key, classroom=classroom)
    for role, content in (("user", "What is a leaf?"), ("assistant", "A leaf makes sugar.")):
        Message.objects.create(conversation=conversation, role=role, content=content)
    return conversation.pk


async def test_a_continued_conversation_is_admitted_by_the_loop_on_postgresql(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    """Its history read by the loop's own connection (on PostgreSQL; on SQLite, on a thread as
    before), the same as the thread's read of it."""
    classroom = await run_db(Classroom.objects.create, name="7B", join_code="LOOPCC")
    key = await run_db(a_session, classroom)
    first, _, _ = await admission(key, turn(classroom), "r1")  # the class read here
    await slots_give_back(slots, first.owner_key, "r1")
    conversation = await run_db(a_conversation_of, first.owner_key, classroom)
    on_thread = (await run_db(_page_admitted, key, turn(classroom, conversation), "r0"))[2]
    await run_db(slots.release, first.owner_key, "r0")
    assert [m.content for m in on_thread] == ["What is a leaf?", "A leaf makes sugar."]
    del hops[:]

    identity, slot, history = await admission(key, turn(classroom, conversation), "r2")
    assert (identity, slot.taken, history) == (first, True, on_thread)
    assert hops == ([] if POSTGRES else ["_page_admitted"])
    assert holders(slots, first.owner_key) == ("r2",)
    assert rate_counts(raw, redis_prefix) == 3


@pytest.mark.skipif(not POSTGRES, reason="the loop reads a history on PostgreSQL only")
async def test_a_follow_ups_history_is_read_while_its_session_is(
    slots: RedisSlots, server_loop: None, hops: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page says what it showed of the class: the history of the conversation, for the
    owner its session key names in that class, is sent before the session's answer comes
    (here held back), not after it, and is the admission's."""
    key = await run_db(a_session)
    owner_key = owner_key_for(None, key)
    conversation = await run_db(a_conversation_of, owner_key, None)
    session_read, history_sent = asyncio.Event(), asyncio.Event()
    send_commands, send_reads = loop_redis.LoopCommands._send, loop_postgres.LoopReads._send

    async def held_back(commands: loop_redis.LoopCommands, batch: list[Any]) -> list[Any]:
        await session_read.wait()
        return await send_commands(commands, batch)

    async def told(reads: loop_postgres.LoopReads, batch: list[Any]) -> list[Any]:
        history_sent.set()
        return await send_reads(reads, batch)

    monkeypatch.setattr(loop_redis.LoopCommands, "_send", held_back)
    monkeypatch.setattr(loop_postgres.LoopReads, "_send", told)
    asked = ChatTurn(message="hi", conversation_id=conversation, shown=(None, False))
    admitted = admission(key, asked, "r1")
    await asyncio.wait_for(history_sent.wait(), 5)
    assert not admitted.done()  # the session's read is still on its way
    session_read.set()
    identity, slot, history = await admitted
    assert (identity.owner_key, slot.taken) == (owner_key, True)
    assert [m.content for m in history] == ["What is a leaf?", "A leaf makes sugar."]
    reads = loop_reads()
    assert reads is not None and (hops, reads.reads) == ([], 1)


@pytest.mark.parametrize("continued", [False, True])
async def test_a_page_showing_a_class_the_student_has_left_is_refused_by_the_thread(
    slots: RedisSlots, server_loop: None, hops: list[str], continued: bool
) -> None:
    """A session in no class, whose page still showed one: the loop admits nothing (a history
    read beside the session is dropped), and the thread refuses it (409 ``class_changed``)."""
    classroom = await run_db(Classroom.objects.create, name="7B", join_code="LOOPLF")
    key = await run_db(a_session)
    mine = await run_db(a_conversation_of, owner_key_for(None, key), None)
    asked = ChatTurn(
        message="hi", conversation_id=mine if continued else None, shown=(classroom.pk, False)
    )
    with pytest.raises(Rejected) as refused:
        await admission(key, asked, "r1")
    assert refused.value.error is errors.CLASS_CHANGED
    assert hops == ["_page_admitted"]


async def test_a_conversation_not_the_askers_is_refused_by_the_thread(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    """The loop takes nothing for it: the thread reads it and refuses it (404), as before."""
    key = await run_db(a_session)
    theirs = await run_db(a_conversation_of, "session:someone-else", None)
    with pytest.raises(ConversationNotFound):
        await admission(key, turn(None, theirs), "r1")
    assert hops == ["_page_admitted"]
    assert rate_counts(raw, redis_prefix) == 1  # the thread's count only
    identity, _, _ = await admission(key, turn(), "r2")  # the thread gave its slot back
    assert holders(slots, identity.owner_key) == ("r2",)


async def test_a_replaced_question_is_admitted_on_a_thread(
    slots: RedisSlots, server_loop: None
) -> None:
    key = await run_db(a_session)
    assert page_admission_on_loop(key, uuid.uuid4(), uuid.uuid4(), None, "r1") is None
    continued = page_admission_on_loop(key, uuid.uuid4(), None, None, "r1")
    assert (continued is not None) is POSTGRES
    if continued is not None:
        assert await continued is None  # no such conversation: the thread refuses it


async def test_a_database_not_postgresql_is_looked_at_once(
    server_loop: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where Django's database is not PostgreSQL the loop reads nothing, and the settings are
    looked at once, not for every follow-up."""
    looked: list[None] = []
    monkeypatch.setattr(loop_postgres, "_connection_params", lambda: looked.append(None))
    assert loop_reads() is None
    assert loop_reads() is None
    assert len(looked) == 1
