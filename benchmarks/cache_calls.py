"""What one cache call costs the worker: Django's Redis cache, the production profile's
(``assistant.cache.SharedRedisCache``), and redis-py alone (the floor).

redis-py reads replies and packs commands with hiredis (C) when it is installed, as chatsite
declares it; the rows marked "Python" use redis-py's own parser and packer instead, beside them.

Django's Redis client builds a ``redis.Redis`` object for every command; the production
backend keeps one per connection pool. A rate limit's count is Django's ``add`` and ``incr``
(three round trips: ``SET NX``, ``EXISTS``, ``INCRBY``) on the stock backend, and one script
(``count_hit``) on the production one. Each figure is the median over ``--rounds`` calls of
the calling thread's CPU time (what the worker pays, the kernel's loopback work included) and of
the time the call took.

Usage: python benchmarks/cache_calls.py [--rounds 3000]
Needs the Redis at 127.0.0.1:6379 (keys under a prefix of the run's own, deleted after).
"""

import argparse
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
from django.core.cache.backends.redis import RedisCache  # noqa: E402

from assistant.cache import SharedRedisCache  # noqa: E402
from benchmarks.stream_slots import REDIS_URL, keys_deleted  # noqa: E402


def measure(call: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median microseconds of ``call``: the thread's CPU, and the time it took."""
    cpu, waits = [], []
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.thread_time()
        call()
        cpu.append((time.thread_time() - started_cpu) * 1e6)
        waits.append((time.perf_counter() - started) * 1e6)
    return statistics.median(cpu), statistics.median(waits)


def stock_count(cache: RedisCache) -> Callable[[], object]:
    """``ratelimit.counter_hit`` on Django's own backend."""

    def count() -> object:
        cache.add("count", 0, timeout=61)
        return cache.incr("count")

    return count


def in_python() -> dict[str, object]:
    """Connection options for redis-py's own RESP parser and command packer, not hiredis's."""
    from redis._parsers import _RESP3Parser
    from redis.connection import Encoder, PythonRespSerializer

    encoder = Encoder("utf-8", "strict", False)
    return {
        "parser_class": _RESP3Parser,
        "command_packer": PythonRespSerializer(6000, encoder.encode),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    prefix = f"bench-cache-{uuid.uuid4().hex[:8]}"
    stock = RedisCache(REDIS_URL, {"KEY_PREFIX": prefix})
    shared = SharedRedisCache(REDIS_URL, {"KEY_PREFIX": prefix})
    shared_python = SharedRedisCache(REDIS_URL, {"KEY_PREFIX": prefix, "OPTIONS": in_python()})
    plain = redis.Redis.from_url(REDIS_URL)
    plain_python = redis.Redis.from_url(REDIS_URL, **in_python())
    stock.set("session", b"x" * 200)
    rows = [
        ("get, Django's backend", lambda: stock.get("session")),
        ("get, SharedRedisCache", lambda: shared.get("session")),
        ("get, SharedRedisCache, Python", lambda: shared_python.get("session")),
        ("get, redis-py alone", lambda: plain.get(stock.make_key("session"))),
        ("get, redis-py alone, Python", lambda: plain_python.get(stock.make_key("session"))),
        ("count, Django's add + incr", stock_count(stock)),
        ("count, SharedRedisCache.count_hit", lambda: shared.count_hit("count", timeout=61)),
        (
            "count, SharedRedisCache.count_hit, Python",
            lambda: shared_python.count_hit("count", timeout=61),
        ),
    ]
    try:
        for _, call in rows:  # connections opened, scripts loaded
            call()
        print(f"median of {args.rounds} calls (µs)")
        print(f"{'call':<44}  {'CPU':>7}  {'took':>7}")
        for name, call in rows:
            cpu, took = measure(call, args.rounds)
            print(f"{name:<44}  {cpu:>7.1f}  {took:>7.1f}")
    finally:
        keys_deleted(plain, prefix)


if __name__ == "__main__":
    main()
