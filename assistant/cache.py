"""The production profile's cache backend: Django's Redis cache, with one client per process.

Django makes a cache object per thread and, on the event loop, per task (each task's context
is its own), and each of Django's Redis cache objects makes its own client, with its own pool of
connections. So every request that touched the cache from a fresh context (the session
middleware's ``SessionStore`` on every page view, an API call, a cache call looked up on the
event loop) opened a new TCP connection to Redis, paid redis-py's handshake, and left the
connection to the garbage collector.

Here the cache objects still come and go as Django makes them, but they share one client per
location and options, and so one pool of connections: redis-py's pool hands each thread a
connection of its own and takes it back after the command. After a fork (a worker started by
a parent that used the cache), redis-py's pool notices the new process and opens new
connections rather than sharing its parent's.

Django's client also builds a new ``redis.Redis`` object for every command (``get_client``),
which costs about as much CPU as the command's own round trip; a ``redis.Redis`` is safe to
share between threads (each command takes a connection from the pool), so here there is one per
pool.

``count_hit`` is a rate limit's count in one round trip (``services/ratelimit.py``), where
Django's ``add`` and ``incr`` take three (``SET NX``, ``EXISTS``, ``INCRBY``).

The local profile's cache is this process's memory (Django's ``LocMemCache``): there
``in_process_cache`` gives one cache object for the process, which code on the event loop uses
instead of a cache object per task and a lookup through ``django.core.cache.cache`` per call.
"""

import functools
import threading
from typing import Any

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.core.signals import setting_changed
from django.utils.functional import cached_property


def count_lua(key: str, ttl_ms: str) -> str:
    """Lua adding one to the count at ``key`` into ``count``; a new count (or one left without
    a time to live) lives ``ttl_ms``, as ``cache.add`` would have given it. ``key`` and
    ``ttl_ms`` are Lua expressions (``KEYS[1]``, ``ARGV[1]``)."""
    return f"""
local count = redis.call('INCR', {key})
if count == 1 or redis.call('PTTL', {key}) == -1 then
  redis.call('PEXPIRE', {key}, tonumber({ttl_ms}))
end
"""


_COUNT = count_lua("KEYS[1]", "ARGV[1]") + "return count\n"


class SharedRedisCacheClient(RedisCacheClient):
    """Django's Redis cache client with one ``redis.Redis`` per connection pool, not one per
    command."""

    def __init__(self, servers: list[str], **options: Any) -> None:
        super().__init__(servers, **options)
        self._redis_by_pool: dict[Any, Any] = {}
        self._count_scripts: dict[Any, Any] = {}

    def _get_connection_pool(self, write: bool) -> Any:
        # Django's checks for the pool and then stores a new one: two threads at once could
        # each store their own, and their ``redis.Redis`` objects then differ. Here the first
        # stored serves everyone (a pool opens no connection until a command needs one).
        index = self._get_connection_pool_index(write)
        pool = self._pools.get(index)
        if pool is None:
            made = self._pool_class.from_url(self._servers[index], **self._pool_options)
            pool = self._pools.setdefault(index, made)
        return pool

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)
        client = self._redis_by_pool.get(pool)
        if client is None:  # two threads at once may both make one: either serves
            client = self._redis_by_pool.setdefault(pool, self._client(connection_pool=pool))
        return client

    def count(self, key: str, ttl_ms: int) -> int:
        client = self.get_client(key, write=True)
        script = self._count_scripts.get(client)
        if script is None:
            script = self._count_scripts.setdefault(client, client.register_script(_COUNT))
        return int(script(keys=[key], args=[ttl_ms]))


_clients: dict[tuple[tuple[str, ...], str], RedisCacheClient] = {}
_clients_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    """``django.core.cache.backends.redis.RedisCache`` whose client (and its connection pool)
    is shared by every cache object of the process with the same location and options."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedRedisCacheClient

    def count_hit(self, key: str, *, timeout: float) -> int:
        """Add one to the integer at ``key`` (a new one lives ``timeout`` seconds) and return
        it, in one round trip; ``get`` reads it, ``decr`` takes one back."""
        return self._cache.count(self.make_and_validate_key(key), int(timeout * 1000))

    @cached_property
    def _cache(self) -> Any:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        client = _clients.get(key)
        if client is None:
            with _clients_lock:
                client = _clients.get(key)
                if client is None:
                    client = _clients[key] = self._class(self._servers, **self._options)
        return client


@functools.cache
def in_process_cache(alias: str = DEFAULT_CACHE_ALIAS) -> LocMemCache | None:
    """Cache ``alias`` where it is this process's memory (calls cost microseconds and need no
    thread), else None; worked out once until the settings change.

    One object serves the whole process: Django's local-memory caches of one location share
    their data and their lock, so it reads and counts what ``caches[alias]`` does in any
    thread or task, without ``caches`` making an object for each task on the event loop (each
    task's context is its own) and ``django.core.cache.cache`` looking it up again on every
    call."""
    made = caches.create_connection(alias)
    return made if isinstance(made, LocMemCache) else None


def _forget_in_process_caches(*, setting: str, **kwargs: object) -> None:
    if setting == "CACHES":
        in_process_cache.cache_clear()


setting_changed.connect(_forget_in_process_caches)
