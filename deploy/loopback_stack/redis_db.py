"""The stack's share of the Redis at 127.0.0.1:6379: its keys, under a prefix of its own.

Redis has no databases to create or drop the way PostgreSQL has, and the tests' Redis may hold
other keys, so each stack's workers write under ``CHATSITE_REDIS_PREFIX`` (the stack's name)
and ``down`` deletes exactly the keys under it. (Named ``redis_db`` so as not to shadow the
``redis`` package it uses.)
"""

from collections.abc import Callable

import redis

from .report import StackError

REDIS = ("127.0.0.1", 6379)


def ping(shell: Callable[[str], str]) -> None:
    """The guide's check that Redis answers (``redis-cli ... ping``)."""
    answer = shell("redis").strip()
    if answer != "PONG":
        raise StackError(f"redis-cli ping answered {answer!r}")


def _client() -> redis.Redis:
    host, port = REDIS
    return redis.Redis(host, port, socket_timeout=60)


def _keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:*"))


def redis_keys(prefix: str) -> list[str]:
    """Every key the stack's workers wrote: the cache's and the channel layer's."""
    with _client() as client:
        return [key.decode(errors="backslashreplace") for key in _keys(client, prefix)]


def delete_redis_keys(prefix: str) -> None:
    with _client() as client:
        keys = _keys(client, prefix)
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
