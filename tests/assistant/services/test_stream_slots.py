"""A student's stream slots (``services/stream_slots.py``), in this process's memory and in the
real Redis at 127.0.0.1:6379 (under a prefix of each test's own): the same behaviour from both,
atomic across threads, and one key per student whatever the cap."""

import threading
import uuid

import pytest
import redis
from django.core.cache.backends.redis import RedisCache

from assistant.services.stream_slots import (
    MemorySlots,
    RateCount,
    RedisSlots,
    SlotStore,
    SlotTry,
)
from tests.support import REDIS_URL

TTL_S = 120.0
NOW = 1_800_000_000.0


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, redis_prefix: str) -> SlotStore:
    if request.param == "memory":
        return MemorySlots()
    return RedisSlots(REDIS_URL, redis_prefix)


def take(store: SlotStore, request_id: str, *, limit: int = 2, now: float = NOW) -> SlotTry:
    return store.take("session:abc", request_id, limit=limit, ttl_s=TTL_S, now=now)


def test_slots_up_to_the_limit_then_the_holders(store: SlotStore) -> None:
    assert take(store, "r1").taken and take(store, "r2").taken
    refused = take(store, "r3")
    assert not refused.taken
    assert sorted(refused.holders) == ["r1", "r2"]
    # Another student is counted apart.
    assert store.take("session:other", "r9", limit=2, ttl_s=TTL_S, now=NOW).taken


def test_a_slot_given_back_is_taken_again(store: SlotStore) -> None:
    take(store, "r1")
    take(store, "r2")
    store.release("session:abc", "r1")
    store.release("session:abc", "never-held")  # nothing happens
    assert take(store, "r3").taken
    assert not take(store, "r4").taken


def test_taking_again_with_the_same_request_is_not_a_second_slot(store: SlotStore) -> None:
    assert take(store, "r1", limit=1).taken
    assert take(store, "r1", limit=1).taken
    store.release("session:abc", "r1")
    assert take(store, "r2", limit=1).taken


def test_a_lost_release_frees_its_slot_after_the_ttl(store: SlotStore) -> None:
    """A worker that died holding a slot: it frees itself ``ttl_s`` after it was taken."""
    take(store, "r1", limit=1)
    assert not take(store, "r2", limit=1, now=NOW + TTL_S - 1).taken
    assert take(store, "r2", limit=1, now=NOW + TTL_S + 1).taken


def test_a_slot_handed_over_belongs_to_the_new_request(store: SlotStore) -> None:
    take(store, "old", limit=1)
    assert store.hand_over("session:abc", "old", "new", ttl_s=TTL_S, now=NOW)
    assert take(store, "other", limit=1).holders == ("new",)
    # A holder that already gave its slot back hands nothing over.
    assert not store.hand_over("session:abc", "old", "third", ttl_s=TTL_S, now=NOW)
    store.release("session:abc", "old")  # the old answer's own release, later: a no-op
    assert take(store, "other", limit=1).holders == ("new",)


def test_requests_at_once_take_exactly_the_limit(store: SlotStore) -> None:
    """Forty threads at once for three slots: exactly three get one."""
    barrier = threading.Barrier(40)
    taken: list[str] = []

    def ask(request_id: str) -> None:
        barrier.wait()
        if take(store, request_id, limit=3).taken:
            taken.append(request_id)

    threads = [threading.Thread(target=ask, args=(f"r{i}",)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(taken) == 3, taken


def test_one_key_per_student_whatever_the_cap(redis_prefix: str) -> None:
    """Redis holds one key per student, however high the cap and however many slots taken, and
    it expires with the last slot's time to live."""
    store = RedisSlots(REDIS_URL, redis_prefix)
    for number in range(50):
        assert store.take("session:abc", f"r{number}", limit=100_000, ttl_s=TTL_S, now=NOW).taken
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{redis_prefix}:*"))
    assert keys == [f"{redis_prefix}:chat:slots:session:abc".encode()]
    assert 0 < client.pttl(keys[0]) <= TTL_S * 1000
    for number in range(50):
        store.release("session:abc", f"r{number}")
    assert client.zcard(keys[0]) == 0


def test_redis_dates_slots_on_its_own_clock(redis_prefix: str) -> None:
    """Without ``now`` (as the site calls it) a slot's time is Redis's, not the worker's: the
    workers' hosts may disagree about the time, Redis does not."""
    store = RedisSlots(REDIS_URL, redis_prefix)
    assert store.take("session:abc", "r1", limit=1, ttl_s=TTL_S).taken
    client = redis.Redis.from_url(REDIS_URL)
    seconds, micros = client.time()
    redis_ms = seconds * 1000 + micros // 1000
    score = client.zscore(f"{redis_prefix}:chat:slots:session:abc", "r1")
    assert score is not None and abs(score - (redis_ms + TTL_S * 1000)) < 5000
    assert store.take("session:abc", "r2", limit=1, ttl_s=TTL_S).holders == ("r1",)
    assert store.hand_over("session:abc", "r1", "r2", ttl_s=TTL_S)


def rate(limit: int, *, key: str) -> RateCount:
    return RateCount(key=key, limit=limit, ttl_s=61.0)


def window_key() -> str:
    """A rate's count key of this test's own (the memory store counts in the process's cache)."""
    return f"ratelimit:chat:{uuid.uuid4().hex}:1"


def test_a_take_counts_its_rate_first_and_over_it_takes_nothing(store: SlotStore) -> None:
    """With a ``RateCount`` every try is counted, taken or not; a try over the rate is refused
    as such and holds no slot, so it cannot stand in another question's way."""
    three = rate(3, key=window_key())
    assert store.take("session:abc", "r1", limit=1, ttl_s=TTL_S, now=NOW, rate=three).taken
    full = store.take("session:abc", "r2", limit=1, ttl_s=TTL_S, now=NOW, rate=three)
    assert (full.taken, full.over_rate, full.holders) == (False, False, ("r1",))
    store.release("session:abc", "r1")
    assert store.take("session:abc", "r3", limit=1, ttl_s=TTL_S, now=NOW, rate=three).taken
    store.release("session:abc", "r3")
    over = store.take("session:abc", "r4", limit=1, ttl_s=TTL_S, now=NOW, rate=three)
    assert over == SlotTry(taken=False, over_rate=True)
    assert take(store, "r5", limit=1).taken  # r4 holds nothing
    # Another window (another key) counts from one again; no cap holds no slot.
    other = rate(3, key=window_key())
    assert store.take("session:abc", "r6", limit=0, ttl_s=TTL_S, now=NOW, rate=other).taken
    assert take(store, "r7", limit=1).holders == ("r5",)


def test_the_count_is_django_caches_own(redis_prefix: str) -> None:
    """In Redis the count is the key and the integer Django's cache would hold, with the
    window's time to live: ``cache.get`` reads it and ``rate_limit_forgive``'s ``decr`` works."""
    store = RedisSlots(REDIS_URL, redis_prefix)
    cache = RedisCache(REDIS_URL, {"KEY_PREFIX": redis_prefix})
    key = window_key()
    for number in range(3):
        store.take("session:abc", f"r{number}", limit=0, ttl_s=TTL_S, rate=rate(10, key=key))
    assert cache.get(key) == 3
    cache.decr(key)
    assert cache.get(key) == 2
    client = redis.Redis.from_url(REDIS_URL)
    pttl = client.pttl(cache.make_key(key))
    assert 0 < pttl <= 61_000
