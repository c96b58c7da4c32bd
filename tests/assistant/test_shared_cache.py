"""The production profile's cache backend (``assistant/cache.py``) against the real Redis at
127.0.0.1:6379, under a prefix of each test's own: cache objects share one client, the client
one ``redis.Redis`` per connection pool (Django's makes one per command), sharing it between
threads loses no command, and a rate limit's count is one round trip."""

import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from assistant.cache import SharedRedisCache
from assistant.services.ratelimit import rate_limit_hit
from tests.support import REDIS_URL, ROOT


def shared(prefix: str) -> SharedRedisCache:
    return SharedRedisCache(REDIS_URL, {"KEY_PREFIX": prefix})


def in_threads(work: Callable[[int], None], count: int) -> None:
    """``work(n)`` on ``count`` threads at once, each given its number; back when all end."""
    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)


def test_commands_from_every_cache_object_and_thread_go_through_one_redis(
    redis_prefix: str,
) -> None:
    """Django makes a cache object per thread and per task: all of them, on every thread, use
    one ``redis.Redis``, instead of a new one built for each command."""
    seen: set[int] = set()

    def look() -> None:
        cache = shared(redis_prefix)  # as Django makes one for a new thread or task
        seen.add(id(cache._cache.get_client("k")))
        seen.add(id(cache._cache.get_client("k", write=True)))

    in_threads(lambda _: look(), 4)
    look()
    assert len(seen) == 1


def test_threads_making_the_first_pool_at_once_keep_one(redis_prefix: str) -> None:
    """Four threads ask for the first connection at the same moment: each makes a pool (they
    are held at a barrier until all have), and all of them, and every later call, use the one
    stored first, where Django's check-then-store kept one per thread."""
    client = shared(redis_prefix)._cache
    made = client._pool_class
    together = threading.Barrier(4)

    class AllAtOnce:
        @staticmethod
        def from_url(url: str, **options: Any) -> Any:
            together.wait(timeout=10)
            return made.from_url(url, **options)

    client._pool_class = AllAtOnce
    seen: list[int] = []

    def look() -> None:
        seen.append(id(shared(redis_prefix)._cache.get_client("k")))

    in_threads(lambda _: look(), 4)
    look()
    assert len(seen) == 5, "a thread did not get its client"
    assert len(set(seen)) == 1
    assert len(client._pools) == 1


def test_replies_are_parsed_and_commands_packed_in_c(redis_prefix: str) -> None:
    """The cache's connections, and those of the channel layer's asyncio client, read Redis's
    replies and pack commands with hiredis (``redis[hiredis]``), not with redis-py's Python
    parser (about a tenth of a cache call's CPU: benchmarks/cache_calls.py)."""
    from redis._parsers import _AsyncHiredisParser, _HiredisParser
    from redis.asyncio.connection import Connection as AsyncConnection
    from redis.connection import HiredisRespSerializer

    pool = shared(redis_prefix)._cache.get_client("k").connection_pool
    connection = pool.make_connection()
    assert isinstance(connection._parser, _HiredisParser)
    assert isinstance(connection._command_packer, HiredisRespSerializer)
    assert isinstance(AsyncConnection()._parser, _AsyncHiredisParser)


def test_threads_sharing_the_client_lose_no_command(redis_prefix: str) -> None:
    """Eight threads, each with its own cache object, 200 increments each on one key and a
    read of a key of its own: every increment counted, every read its own value."""
    cache = shared(redis_prefix)
    cache.set("count", 0)
    wrong: list[str] = []

    def work(number: int) -> None:
        mine = shared(redis_prefix)
        mine.set(f"own:{number}", number)
        for _ in range(200):
            mine.incr("count")
            if mine.get(f"own:{number}") != number:
                wrong.append(f"thread {number} read another value")

    in_threads(work, 8)
    assert wrong == []
    assert cache.get("count") == 1600
    assert cache.get_many([f"own:{n}" for n in range(8)]) == {f"own:{n}": n for n in range(8)}


def test_a_count_is_one_round_trip_and_an_integer_django_reads(redis_prefix: str) -> None:
    """``count_hit`` counts in one command (a script), where ``add`` and ``incr`` sent three
    (``SET NX``, ``EXISTS``, ``INCRBY``); the count lives the window it was given, ``get``
    reads it and ``decr`` takes one back (``rate_limit_forgive``)."""
    cache = shared(redis_prefix)
    assert cache.count_hit("warm", timeout=61) == 1  # loads the script
    client = redis.Redis.from_url(REDIS_URL)
    before = command_calls(client)
    assert [cache.count_hit("window", timeout=61) for _ in range(20)] == list(range(1, 21))
    after = command_calls(client)
    assert {name: after[name] - before[name] for name in after} == {
        "set": 0,
        "exists": 0,
        "incrby": 0,
        "evalsha": 20,
    }
    assert cache.get("window") == 20
    cache.decr("window")
    assert cache.get("window") == 19
    assert 0 < client.pttl(cache.make_key("window")) <= 61_000


def test_the_rate_limits_count_in_one_round_trip_on_the_production_cache(
    redis_prefix: str, settings: Any
) -> None:
    """``ratelimit.rate_limit_hit`` on the production profile's cache: within the limit, then
    the seconds until the window turns, each question one command."""
    settings.CACHES = {
        "default": {
            "BACKEND": "assistant.cache.SharedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": redis_prefix,
        }
    }
    rate_limit_hit(scope="beacon", key="warm", limit=5, window_s=60)
    client = redis.Redis.from_url(REDIS_URL)
    before = command_calls(client)
    found = [rate_limit_hit(scope="beacon", key="abc", limit=5, window_s=60) for _ in range(6)]
    after = command_calls(client)
    assert found[:5] == [None] * 5
    assert found[5] is not None and 1 <= found[5] <= 60
    assert after["evalsha"] - before["evalsha"] == 6
    assert after["set"] - before["set"] == 0


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls Redis has served of the commands a count may send (a script's own are counted
    under their names too, so the script's INCR is not among those looked at)."""
    stats = client.info("commandstats")
    names = ("set", "exists", "incrby", "evalsha")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names}


@pytest.mark.parametrize(
    ("command", "row"),
    [
        (["benchmarks/cache_calls.py", "--rounds", "20"], "count, SharedRedisCache.count_hit"),
        (["benchmarks/stream_slots.py", "--rounds", "20", "--caps", "1"], "redis"),
    ],
)
def test_the_benchmarks_print_their_figures(command: list[str], row: str) -> None:
    """benchmarks/cache_calls.py and the admission table of benchmarks/stream_slots.py (its
    last ``redis`` row) run against the real Redis and print their figures (which are theirs
    to report, not this test's)."""
    done = subprocess.run(
        [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = [line for line in done.stdout.splitlines() if line.startswith(f"{row} ")][-1]
    figures = line.removeprefix(row).split()
    assert len(figures) >= 2 and all(float(figure) > 0 for figure in figures), line
