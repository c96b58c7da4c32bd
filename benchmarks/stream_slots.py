"""What one student's stream-slot bookkeeping costs (take a slot, give it back), by cap.

``services/stream_slots.py`` keeps a student's slots in one set (a Redis sorted set, or this
process's memory) and takes or gives one back in one step. The baseline beside it is the scheme
it replaced: one cache key per slot, through Django's cache, where taking tries ``cache.add`` on
each key in turn and giving back reads each key until it finds its request. Each round holds
``--held`` slots already (other answers of the same student) and takes and gives back one more.

A second table is a question's whole admission with a cap of one: its rate counted, its slot
taken, then given back. ``one step`` counts in the slot store's take (one script, one round trip
to Redis); the baseline is the scheme it replaced, the count through Django's cache (``add``
and ``incr``: three round trips, ``SET NX``, ``EXISTS``, ``INCRBY``) and then the take. Both
the time a question waits and the CPU time of the thread asking (what the worker pays) are
shown.

A third table is what an answer's give-back costs the worker on Redis, ``--concurrency`` at a
time from the event loop (uvloop, as the servers run it): sent from a database thread
(``run_db``, as every step of the slot store was) and sent by the loop's own client
(``release_on_loop``, ``assistant/loop_redis.py``), in turns; the CPU time of the whole process
per give-back, and the wall time.

Usage: python benchmarks/stream_slots.py [--rounds 2000] [--caps 1 100 100000] [--held 0]
                                         [--concurrency 50]
Needs the Redis at 127.0.0.1:6379 (keys under a prefix of the run's own, deleted after).
"""

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.core.cache.backends.base import BaseCache  # noqa: E402
from django.core.cache.backends.locmem import LocMemCache  # noqa: E402
from django.core.cache.backends.redis import RedisCache  # noqa: E402

from assistant.cache import SharedRedisCache  # noqa: E402
from assistant.db import run_db  # noqa: E402
from assistant.loop_redis import loop_redis_allow, loop_redis_close  # noqa: E402
from assistant.services.stream_slots import (  # noqa: E402
    MemorySlots,
    RateCount,
    RedisSlots,
    SlotStore,
)
from chatsite.event_loop import event_loop_install  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
OWNER = "session:bench"
TTL_S = 120
Steps = tuple[Callable[[str], bool], Callable[[str], None]]


def per_slot_keys(
    cache: BaseCache, cap: int
) -> tuple[Callable[[str], bool], Callable[[str], None]]:
    """The replaced scheme: one key per slot (take: ``add`` each in turn; give back: ``get``
    each until the request's own, then ``delete``)."""

    def keys() -> list[str]:  # built on every call, as the replaced code did
        return [f"chat:streaming:{OWNER}:{slot}" for slot in range(cap)]

    def take(request_id: str) -> bool:
        return any(cache.add(key, request_id, timeout=TTL_S) for key in keys())

    def release(request_id: str) -> None:
        for key in keys():
            if cache.get(key) == request_id:
                cache.delete(key)
                return

    return take, release


def one_set(store: SlotStore, cap: int) -> Steps:
    def take(request_id: str) -> bool:
        return store.take(OWNER, request_id, limit=cap, ttl_s=TTL_S).taken

    def release(request_id: str) -> None:
        store.release(OWNER, request_id)

    return take, release


def measure(steps: Steps, *, rounds: int, held: int) -> float:
    """Median microseconds of one take plus one give-back, with ``held`` slots already held."""
    take, release = steps
    for number in range(held):
        assert take(f"held-{number}")
    times = []
    for number in range(rounds):
        started = time.perf_counter()
        assert take(f"r{number}")
        release(f"r{number}")
        times.append((time.perf_counter() - started) * 1e6)
    for number in range(held):
        release(f"held-{number}")
    return statistics.median(times)


#: A rate no question of the benchmark reaches.
RATE = RateCount(key=f"ratelimit:chat:{OWNER}:0", limit=10**9, ttl_s=61)


def admit_one_step(store: SlotStore) -> Callable[[str], bool]:
    def admit(request_id: str) -> bool:
        return store.take(OWNER, request_id, limit=1, ttl_s=TTL_S, rate=RATE).taken

    return admit


def admit_count_then_take(store: SlotStore, cache: BaseCache) -> Callable[[str], bool]:
    """The replaced admission: ``ratelimit.counter_hit``'s ``add`` and ``incr``, then the take."""

    def admit(request_id: str) -> bool:
        cache.add(RATE.key, 0, timeout=RATE.ttl_s)
        if cache.incr(RATE.key) > RATE.limit:
            return False
        return store.take(OWNER, request_id, limit=1, ttl_s=TTL_S).taken

    return admit


def measure_admission(
    admit: Callable[[str], bool], store: SlotStore, *, rounds: int
) -> tuple[float, float]:
    """Median microseconds of one admission and give-back: waited, and the thread's CPU."""
    waits, cpu = [], []
    for number in range(rounds):
        started, started_cpu = time.perf_counter(), time.thread_time()
        assert admit(f"a{number}")
        store.release(OWNER, f"a{number}")
        waits.append((time.perf_counter() - started) * 1e6)
        cpu.append((time.thread_time() - started_cpu) * 1e6)
    return statistics.median(waits), statistics.median(cpu)


def admissions(prefix: str, rounds: int) -> None:
    print(f"\nadmission (count + take + give back), cap 1, median of {rounds} (µs)")
    print(f"{'store':<7}  {'one step':>18}  {'count, then take':>18}")
    print(f"{'':<7}  {'wait':>8}  {'CPU':>8}  {'wait':>8}  {'CPU':>8}")
    for name in ("memory", "redis"):
        if name == "memory":
            store: SlotStore = MemorySlots()
            cache: BaseCache = LocMemCache("bench-admission", {})
        else:
            cache = SharedRedisCache(REDIS_URL, {"KEY_PREFIX": prefix})
            store = RedisSlots(REDIS_URL, prefix, count_key=cache.make_key)
        new = measure_admission(admit_one_step(store), store, rounds=rounds)
        old = measure_admission(admit_count_then_take(store, cache), store, rounds=rounds)
        print(f"{name:<7}  {new[0]:>8.1f}  {new[1]:>8.1f}  {old[0]:>8.1f}  {old[1]:>8.1f}")


async def give_backs(
    store: RedisSlots, *, rounds: int, concurrency: int, on_loop: bool
) -> tuple[float, float]:
    """Microseconds of the process's CPU and of wall time per give-back, ``rounds`` slots (one
    per student) given back ``concurrency`` at a time."""
    owners = [f"{OWNER}-{number}" for number in range(rounds)]
    for owner in owners:
        assert store.take(owner, "r", limit=1, ttl_s=TTL_S).taken
    pending = iter(owners)

    async def giver() -> None:
        for owner in pending:
            if on_loop:
                assert await store.release_on_loop(owner, "r")
            else:
                await run_db(store.release, owner, "r")

    started, started_cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(giver() for _ in range(concurrency)))
    cpu, wall = time.process_time() - started_cpu, time.perf_counter() - started
    return cpu * 1e6 / rounds, wall * 1e6 / rounds


async def give_backs_compared(prefix: str, rounds: int, concurrency: int) -> None:
    store = RedisSlots(REDIS_URL, prefix)
    print(f"\nan answer's give-back on Redis, {concurrency} at a time, {rounds} a turn (µs each)")
    print(f"{'sent':<20}  {'CPU':>8}  {'wall':>8}")
    loop_redis_allow()
    try:
        for turn in range(4):
            on_loop = bool(turn % 2)
            cpu, wall = await give_backs(
                store, rounds=rounds, concurrency=concurrency, on_loop=on_loop
            )
            sent = "by the loop's client" if on_loop else "from a thread"
            print(f"{sent:<20}  {cpu:>8.1f}  {wall:>8.1f}")
    finally:
        await loop_redis_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--caps", type=int, nargs="+", default=[1, 100, 100_000])
    parser.add_argument("--held", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=50, help="give-backs at once")
    args = parser.parse_args()
    prefix = f"bench-slots-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    print(f"take + give back, median of {args.rounds}, {args.held} other slots held (µs)")
    print(f"{'cap':>8}  {'store':<7}  {'one set':>9}  {'per-slot keys':>14}")
    try:
        for cap in args.caps:
            if cap <= args.held:
                continue
            rounds = args.rounds if cap <= 100 else max(20, args.rounds // 100)
            for name in ("memory", "redis"):
                if name == "memory":
                    store: SlotStore = MemorySlots()
                    cache: BaseCache = LocMemCache(f"bench-{cap}", {})
                else:
                    store = RedisSlots(REDIS_URL, prefix)
                    cache = RedisCache(REDIS_URL, {"KEY_PREFIX": prefix})
                new = measure(one_set(store, cap), rounds=args.rounds, held=args.held)
                old = measure(per_slot_keys(cache, cap), rounds=rounds, held=args.held)
                print(f"{cap:>8}  {name:<7}  {new:>9.1f}  {old:>14.1f}")
        admissions(prefix, args.rounds)
        event_loop_install()
        asyncio.run(give_backs_compared(prefix, args.rounds, args.concurrency))
    finally:
        keys_deleted(client, prefix)


def keys_deleted(client: redis.Redis, prefix: str) -> None:
    """Delete the run's keys (those under ``prefix``)."""
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)


if __name__ == "__main__":
    main()
