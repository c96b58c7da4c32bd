"""A page's question that says what it showed of the class, admitted by the event loop in one
command (``loop_admission._Guess``: the try for a slot made with the session's read,
``slot_scripts.TAKE_SEEN``), on the real Redis at 127.0.0.1:6379; and every case where the
session names someone else: the try undone (``GIVE_BACK``), the thread's admission unchanged,
counted once."""

import functools
import uuid

import pytest
import redis
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User

from assistant import errors, loop_redis
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.models import Classroom
from assistant.services import slot_scripts
from assistant.services.chat_request import ChatTurn
from assistant.services.classrooms import class_context_load
from assistant.services.conversations import ConversationNotFound
from assistant.services.identity import owner_key_for
from assistant.services.stream_slots import RateCount, RedisSlots
from tests.assistant.services.test_loop_admission import (
    POSTGRES,
    a_conversation_of,
    a_session,
    admission,
    holders,
    hops,
    rate_counts,
    raw,
    slots,
    slots_give_back,
    turn,
)
from tests.support import REDIS_URL

__all__ = ["hops", "raw", "slots"]  # fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def scripts_loaded(raw: redis.Redis) -> None:
    """Redis has the scripts already, as it has after a worker's first question."""
    for script in (slot_scripts.TAKE, slot_scripts.TAKE_SEEN, slot_scripts.GIVE_BACK):
        raw.script_load(script)


def loop_commands() -> tuple[int, int]:
    """Batches and commands the loop's client has sent so far."""
    commands = loop_redis._state.clients.get(REDIS_URL)
    return (0, 0) if commands is None else (commands.batches, commands.commands)


async def test_a_student_of_a_class_shown_is_admitted_in_one_command(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    classroom = await run_db(Classroom.objects.create, name="7B", join_code="GUESSA", chat_rate=30)
    key = await run_db(a_session, classroom)
    first, _, _ = await admission(key, turn(classroom), "r1")  # the class read here (a thread)
    await slots_give_back(slots, first.owner_key, "r1")
    before = loop_commands()

    again, slot, history = await admission(key, turn(classroom), "r2")
    after = loop_commands()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)  # one round trip, one command
    assert (again, slot.taken, history, hops) == (first, True, [], ["_page_admitted"])
    assert holders(slots, first.owner_key) == ("r2",)
    assert rate_counts(raw, redis_prefix) == 2


async def test_a_student_of_no_class_is_admitted_in_one_command(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    key = await run_db(a_session)
    identity, slot, _ = await admission(key, turn(), "r0")  # shown nothing: read, then tried
    assert loop_commands()[1] == 2
    await slots_give_back(slots, identity.owner_key, "r0")
    before = loop_commands()[1]
    again, slot, _ = await admission(key, no_class_shown(), "r1")
    assert (again, slot.taken, hops) == (identity, True, [])
    assert loop_commands()[1] - before == 1
    assert rate_counts(raw, redis_prefix) == 2


def no_class_shown(conversation: uuid.UUID | None = None) -> ChatTurn:
    """A question from a page that showed no class."""
    return ChatTurn(message="hi", conversation_id=conversation, shown=(None, False))


def logged_in(user: User) -> str:
    return a_session(
        **{
            SESSION_KEY: str(user.pk),
            BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
            HASH_SESSION_KEY: user.get_session_auth_hash(),
        }
    )


async def test_a_logged_in_users_question_is_counted_once_for_them(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    """The try made for the session's anonymous owner is undone; the thread's admission counts
    and holds for the user."""
    user = await run_db(User.objects.create, username="teacher")
    key = await run_db(logged_in, user)
    identity, slot, _ = await admission(key, no_class_shown(), "r1")
    assert (identity.owner_key, slot.taken) == (f"user:{user.pk}", True)
    assert hops == ["_page_admitted"]
    assert holders(slots, owner_key_for(None, key)) == ()
    assert holders(slots, identity.owner_key) == ("r1",)
    assert rate_counts(raw, redis_prefix) == 1
    assert list(raw.scan_iter(match=f"{redis_prefix}:*ratelimit:chat*")) != []  # the user's


async def test_a_session_not_in_the_cache_counts_nothing_on_the_loop(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    key = await run_db(a_session)
    raw.delete(*raw.scan_iter(match=f"{redis_prefix}:*cached_db{key}"))
    identity, slot, _ = await admission(key, no_class_shown(), "r1")  # read from the database
    assert (identity.owner_key, slot.taken) == (owner_key_for(None, key), True)
    assert hops == ["_page_admitted"]
    assert loop_commands()[1] == 1  # the try, which counted nothing: nothing to undo
    assert holders(slots, identity.owner_key) == ("r1",)
    assert rate_counts(raw, redis_prefix) == 1


@pytest.mark.parametrize("in_class", ["another", "none"])
async def test_a_session_in_another_class_than_shown_is_refused_by_the_thread(
    slots: RedisSlots,
    server_loop: None,
    hops: list[str],
    raw: redis.Redis,
    redis_prefix: str,
    in_class: str,
) -> None:
    """Both classes read here: the page's is tried, the session says otherwise; the try is
    undone and the thread refuses (409 ``class_changed``), having counted nothing."""
    shown = await run_db(Classroom.objects.create, name="7B", join_code="GUESSB")
    other = await run_db(Classroom.objects.create, name="7C", join_code="GUESSC")
    for classroom in (shown, other):
        await run_db(class_context_load, str(classroom.pk))
    key = await run_db(a_session, other if in_class == "another" else None)
    with pytest.raises(Rejected) as refused:
        await admission(key, turn(shown), "r1")
    assert refused.value.error is errors.CLASS_CHANGED
    assert hops == ["_page_admitted"]
    assert loop_commands()[1] == 2  # the try, and its undoing
    assert holders(slots, owner_key_for(None, key)) == ()
    assert rate_counts(raw, redis_prefix) == 0
    assert list(raw.scan_iter(match=f"{redis_prefix}:*ratelimit:chat*")) == []


@pytest.mark.skipif(not POSTGRES, reason="the loop reads a history on PostgreSQL only")
async def test_a_conversation_not_the_askers_is_undone_and_refused_by_the_thread(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    key = await run_db(a_session)
    theirs = await run_db(a_conversation_of, "session:someone-else", None)
    with pytest.raises(ConversationNotFound):
        await admission(key, no_class_shown(theirs), "r1")
    assert hops == ["_page_admitted"]
    assert rate_counts(raw, redis_prefix) == 1  # the thread's count only
    mine = await run_db(a_conversation_of, owner_key_for(None, key), None)
    identity, slot, history = await admission(key, no_class_shown(mine), "r2")
    assert (slot.taken, [m.content for m in history]) == (
        True,
        ["What is a leaf?", "A leaf makes sugar."],
    )
    assert hops == ["_page_admitted"]
    assert holders(slots, identity.owner_key) == ("r2",)


async def test_an_undone_try_takes_its_count_off_and_leaves_no_count_without_expiry(
    slots: RedisSlots, server_loop: None, raw: redis.Redis, redis_prefix: str
) -> None:
    owner = f"session:{uuid.uuid4().hex}"
    rate = RateCount(key=f"count-{uuid.uuid4().hex[:6]}", limit=10, ttl_s=60)
    take = functools.partial(slots.take, owner, limit=1, ttl_s=60, rate=rate)
    assert take("r1").taken and not take("r2").taken  # counted twice, one slot
    count_key = next(iter(raw.scan_iter(match=f"{redis_prefix}:*{rate.key}")))
    await slots.give_back_on_loop(owner, "r1", rate)
    assert (raw.get(count_key), holders(slots, owner)) == (b"1", ())
    assert 0 < raw.pttl(count_key) <= 60_000
    await slots.give_back_on_loop(owner, "r2", rate)
    assert not raw.exists(count_key)
    await slots.give_back_on_loop(owner, "r3", rate)  # a count that has lapsed: none made
    assert not raw.exists(count_key)


async def test_all_slots_taken_as_guessed_names_their_holders(
    slots: RedisSlots, server_loop: None, hops: list[str], raw: redis.Redis, redis_prefix: str
) -> None:
    """The slot's script's answer inside the session's (``{session, {0, holders}}``): the
    question is counted and told who holds the slot, as on the thread."""
    key = await run_db(a_session)
    first, _, _ = await admission(key, no_class_shown(), "r1")  # r1 keeps its slot
    before = loop_commands()[1]
    again, slot, _ = await admission(key, no_class_shown(), "r2")
    assert (again, slot.taken, slot.holders, slot.over_rate) == (first, False, ("r1",), False)
    assert (loop_commands()[1] - before, hops) == (1, [])
    assert rate_counts(raw, redis_prefix) == 2
