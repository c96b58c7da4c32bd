"""A question's admission (``services/admission.py: chat_admit``): its rate counted and its
stream slot taken in one step of the slot store. On the local profile's memory, and on the
production profile's cache and slots in the real Redis at 127.0.0.1:6379 (under a prefix of
each test's own)."""

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from assistant import errors
from assistant.engines import get_engine
from assistant.errors import Rejected
from assistant.services import answer_open, answer_start, stream_slots
from assistant.services.admission import chat_admit, chat_slot_take
from assistant.services.stream_slots import MemorySlots, RedisSlots, SlotStore, slot_store
from tests.assistant.services.answer_support import ALIAS, Harness, Live, question
from tests.support import REDIS_URL, thread_trips


@pytest.fixture(params=["memory", "redis"])
def slots(
    request: pytest.FixtureRequest,
    redis_prefix: str,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> SlotStore:
    """The site's cache and slot store for this test: this process's memory, or Redis as the
    production profile has them."""
    if request.param == "memory":
        monkeypatch.setattr(stream_slots, "_store", MemorySlots())
    else:
        redis_site(settings, redis_prefix, monkeypatch)
    monkeypatch.setitem(settings.CHATSITE_STREAM, "STREAMS_PER_SESSION", 4)
    return slot_store()


def redis_site(settings: Any, redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The production profile's cache in Redis, under ``redis_prefix``, and the slot store made
    from it as the site makes it."""
    settings.CACHES = {
        "default": {
            "BACKEND": "assistant.cache.SharedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": redis_prefix,
        }
    }
    monkeypatch.setattr(stream_slots, "_store", None)


def test_over_the_rate_is_429_with_retry_after_and_holds_no_slot(slots: SlotStore) -> None:
    owner = f"session:{uuid.uuid4().hex}"
    for number in range(3):
        assert chat_admit(owner_key=owner, request_id=f"r{number}", rate=3).taken
    with pytest.raises(Rejected) as refused:
        chat_admit(owner_key=owner, request_id="r3", rate=3)
    assert refused.value.error is errors.RATE_LIMITED
    assert refused.value.retry_after is not None and 1 <= refused.value.retry_after <= 60
    # The refused question took none of the four slots: one is still free, then none.
    assert chat_slot_take(owner_key=owner, request_id="r4").taken
    holders = chat_slot_take(owner_key=owner, request_id="r5").holders
    assert sorted(holders) == ["r0", "r1", "r2", "r4"]


def test_the_slots_refuse_within_the_rate(slots: SlotStore) -> None:
    """All slots taken: the try is counted and refused with the holders, not the rate."""
    owner = f"session:{uuid.uuid4().hex}"
    for number in range(4):
        assert chat_admit(owner_key=owner, request_id=f"r{number}", rate=30).taken
    tried = chat_admit(owner_key=owner, request_id="r4", rate=30)
    assert (tried.taken, tried.over_rate) == (False, False)
    assert sorted(tried.holders) == ["r0", "r1", "r2", "r3"]


def test_no_cap_still_counts_the_rate(slots: SlotStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(stream_slots.settings.CHATSITE_STREAM, "STREAMS_PER_SESSION", 0)
    owner = f"session:{uuid.uuid4().hex}"
    for number in range(5):
        assert chat_admit(owner_key=owner, request_id=f"r{number}", rate=5).taken
    with pytest.raises(Rejected):
        chat_admit(owner_key=owner, request_id="r5", rate=5)


def test_on_redis_a_question_is_admitted_in_one_command(
    redis_prefix: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One script per question counts the rate and takes the slot. Before, the count was
    Django's ``add`` and ``incr`` (``SET NX``, ``EXISTS``, ``INCRBY``), then the slot's script:
    four round trips. (Redis's statistics count the commands a script runs too, so the
    script's own ``INCR`` is not told from a separate one; the ``SET NX`` is what only the
    separate count sends.)"""
    redis_site(settings, redis_prefix, monkeypatch)
    assert isinstance(slot_store(), RedisSlots)
    chat_admit(owner_key="session:warm-up", request_id="w", rate=100)  # loads the script
    client = redis.Redis.from_url(REDIS_URL)
    before = command_calls(client)
    owner = f"session:{uuid.uuid4().hex}"
    for number in range(30):
        chat_admit(owner_key=owner, request_id=f"r{number}", rate=100)
    after = command_calls(client)
    assert after["set"] - before["set"] == 0
    assert after["evalsha"] - before["evalsha"] <= 31


def command_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("set", "evalsha")}


async def test_a_new_question_is_admitted_on_the_loop_and_a_follow_up_on_a_thread(
    local_memory: None, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local profile: a page session in this process's memory needs no trip to a database
    thread to ask something new (its rate and slot are counted all the same); continuing a
    conversation reads its history there."""
    hops = thread_trips(monkeypatch, answer_open)
    first = await harness.start(question("new", tokens=2))
    hops_first = list(hops)
    # Its slot is held, as a thread's admission holds it: the session's one is taken.
    holders = slot_store().take(harness.owner_key, "another", limit=1, ttl_s=60).holders
    await harness.ended(harness.run(first, Live()))
    assert (first.identity.owner_key, hops_first) == (harness.owner_key, [])
    assert holders == (first.request_id,)

    again = await harness.start(
        question("again", tokens=2), conversation=first.exchange.conversation_id
    )
    await harness.ended(harness.run(again, Live()))
    assert again.identity == first.identity
    assert hops == ["_page_admitted"]


async def test_the_engines_first_step_goes_out_before_the_asker_is_admitted(
    local_memory: None, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new conversation's engine starts first and works while the asker is read, whether the
    admission is on a thread or, as here, on the loop: its first step is not queued behind it."""
    order: list[str] = []
    engine = get_engine(ALIAS)
    real_stream = engine.stream

    async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        order.append("engine")
        async for delta in real_stream(*args, **kwargs):
            yield delta

    real_identity = answer_start.identity_in_memory

    def identity(session_key: str) -> Any:
        order.append("admission")
        return real_identity(session_key)

    monkeypatch.setattr(engine, "stream", stream)
    monkeypatch.setattr(answer_start, "identity_in_memory", identity)
    answer = await harness.start(question("first step", tokens=2))
    seen = list(order)
    await harness.ended(harness.run(answer, Live()))
    assert seen == ["engine", "admission"]
