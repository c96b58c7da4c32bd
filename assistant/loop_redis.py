"""Redis from the event loop: the round trip every answer makes at its end, without a thread.

A command sent from a database thread (``assistant.db.run_db``) costs that thread's wake-up and,
when Redis answers, the GIL back from the event loop: with fifty commands at once, about 110 µs
of the worker's CPU a command, where redis-py's asyncio client sends the same command from the
loop for 35-50 µs (``benchmarks/stream_slots.py --on-loop``). Every answer gives back its stream
slot before its last frame (``services/stream_slots.py``): in the production profile that is one
command to Redis per answer, and it is sent from here.

A server process has one event loop, and one client on it, with a few connections (a command
waits for a free one rather than opening one per answer at once). Only a server opens it: the
worker's entry points call ``loop_redis_allow`` as they start, and ``loop_redis_close`` runs as
the worker stops, after the answers left are stored (``assistant/lifespan.py``). On any other
loop (a management command, a test's own loop, a loop of asgiref's in a thread) ``loop_redis``
gives None and the caller goes through a thread as before: a client there would be left with
open connections when its loop ends.
"""

import asyncio
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis

#: Connections the loop's client keeps at most.
CONNECTIONS = 4
#: What its connections are called in Redis's ``CLIENT LIST``, before the worker's process id.
LOOP_CLIENT_NAME = "chatsite-loop"


class _LoopClients:
    """The clients of the one event loop that may have them, by Redis URL."""

    def __init__(self) -> None:
        self.allowed = False
        self.closed = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clients: dict[str, Redis] = {}


_state = _LoopClients()


def loop_redis_allow() -> None:
    """This process is a server: the first event loop to ask gets a client, and keeps it until
    ``loop_redis_close``."""
    _state.allowed = True


def loop_redis(url: str) -> "Redis | None":
    """The running loop's client for the Redis at ``url``, made on first use; None where the loop
    may have none (see the module docstring)."""
    state = _state
    if not state.allowed or state.closed:
        return None
    loop = asyncio.get_running_loop()
    if state.loop is None:
        state.loop = loop
    elif loop is not state.loop:
        return None
    client = state.clients.get(url)
    if client is None:
        from redis.asyncio import BlockingConnectionPool, Redis

        pool = BlockingConnectionPool.from_url(
            url, max_connections=CONNECTIONS, client_name=f"{LOOP_CLIENT_NAME}-{os.getpid()}"
        )
        client = state.clients[url] = Redis.from_pool(pool)  # closing it closes the pool
    return client


async def loop_redis_close() -> None:
    """Close the loop's clients (the worker is stopping); from now on ``loop_redis`` gives None.
    On another loop than the clients', nothing is closed."""
    state = _state
    if state.loop is not None and asyncio.get_running_loop() is not state.loop:
        return
    state.closed = True
    clients, state.clients = state.clients, {}
    for client in clients.values():
        await client.aclose()
