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
"""

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple[tuple[str, ...], str], RedisCacheClient] = {}
_clients_lock = threading.Lock()


class SharedRedisCache(RedisCache):
    """``django.core.cache.backends.redis.RedisCache`` whose client (and its connection pool)
    is shared by every cache object of the process with the same location and options."""

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
