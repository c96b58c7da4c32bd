"""Redis from the event loop: the round trips every answer makes at its start and its end,
without a thread.

A command sent from a database thread (``assistant.db.run_db``) costs that thread's wake-up and,
when Redis answers, the GIL back from the event loop: with fifty commands at once, 110-149 µs of
the worker's CPU a command on this machine, where they cost far less sent from the loop
(``benchmarks/stream_slots.py``). In the production profile a new question's session read and
try for a stream slot (``services/loop_admission.py``), and every answer's give-back of its slot
before its last frame (``services/stream_slots.py``), are sent from here.

The commands go in batches (``LoopCommands``): those asked for while a batch is on its way go
together in the next, one pipeline and one round trip. On a busy loop a reply waits for the
loop's turn however fast Redis is, so commands sent one by one on a few connections would queue
for a connection (at a thousand students, their give-backs waited seconds); a batch takes
whatever waits, on one connection, and the busier the loop the more each round trip carries.

A server process has one event loop, and one client on it. Only a server opens it:
``chatsite.uvicorn_server`` calls ``loop_redis_allow`` as it starts, and ``loop_redis_close``
runs as the worker stops, after the answers left are stored (``assistant/lifespan.py``). On any
other loop (a management command, a test's own loop, a loop of asgiref's in a thread)
``loop_redis_commands`` gives None and the caller goes through a thread as before: a client
there would be left with open connections when its loop ends.

Under Daphne the give-back stays on a thread. A reply on the loop waits for the loop's turns,
and Daphne's are longer: at 500 students through nginx its answers' last frames came later
(P99 from the last token to ``done`` 24 ms from a thread, 81 ms from the loop, where under
uvicorn it was 21 and 16 ms; docs/performance.md).
"""

import asyncio
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis.asyncio import Redis

#: Connections the loop's client keeps: one batch is on its way at a time.
CONNECTIONS = 1
#: What its connections are called in Redis's ``CLIENT LIST``, before the worker's process id.
LOOP_CLIENT_NAME = "chatsite-loop"
#: How long a stopping worker waits for the batch on its way before it closes the connection.
CLOSE_WAIT_S = 2.0


class _LoopClients:
    """The clients of the one event loop that may have them, by Redis URL."""

    def __init__(self) -> None:
        self.allowed = False
        self.closed = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clients: dict[str, LoopCommands] = {}


_state = _LoopClients()


def loop_redis_allow() -> None:
    """This process is a server: the first event loop to ask gets a client, and keeps it until
    ``loop_redis_close``."""
    _state.allowed = True


class LoopCommands:
    """Commands to one Redis from the event loop, sent in batches: ``send`` queues one; those
    queued while a batch is on its way go in the next, one pipeline (one round trip)."""

    def __init__(self, client: "Redis") -> None:
        self.client = client
        self._queued: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._sending: asyncio.Task[None] | None = None

    def send(self, *command: Any) -> "asyncio.Future[Any]":
        """Queue ``command`` (``"ZREM", key, member``); its reply, or the error Redis or the
        connection gave, comes in the future."""
        loop = asyncio.get_running_loop()
        reply = loop.create_future()
        self._queued.append((command, reply))
        if self._sending is None:
            self._sending = loop.create_task(self._batches())
        return reply

    async def _batches(self) -> None:
        batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                try:
                    async with self.client.pipeline(transaction=False) as pipe:
                        for command, _ in batch:
                            pipe.execute_command(*command)
                        replies = await pipe.execute(raise_on_error=False)
                except Exception as error:  # the connection: every command of the batch failed
                    replies = [error] * len(batch)
                for (_, reply), found in zip(batch, replies, strict=True):
                    if reply.done():  # its caller stopped waiting
                        continue
                    if isinstance(found, Exception):
                        reply.set_exception(found)
                    else:
                        reply.set_result(found)
        except BaseException:  # cancelled (the loop is ending): nobody is left waiting forever
            for _, reply in [*batch, *self._queued]:
                reply.cancel()
            self._queued = []
            raise
        finally:
            self._sending = None

    async def close(self) -> None:
        """Wait for the batch on its way, if any (at most ``CLOSE_WAIT_S``: a Redis that does
        not answer does not hold the worker up), then close the connection."""
        sending = self._sending
        if sending is not None:
            await asyncio.wait({sending}, timeout=CLOSE_WAIT_S)
        await self.client.aclose()


def loop_redis_commands(url: str) -> LoopCommands | None:
    """The running loop's commands to the Redis at ``url``, its client made on first use; None
    where the loop may have none (see the module docstring)."""
    state = _state
    if not state.allowed or state.closed:
        return None
    loop = asyncio.get_running_loop()
    if state.loop is None:
        state.loop = loop
    elif loop is not state.loop:
        return None
    commands = state.clients.get(url)
    if commands is None:
        from redis.asyncio import BlockingConnectionPool, Redis

        pool = BlockingConnectionPool.from_url(
            url, max_connections=CONNECTIONS, client_name=f"{LOOP_CLIENT_NAME}-{os.getpid()}"
        )
        client = Redis.from_pool(pool)  # closing it closes the pool
        commands = state.clients[url] = LoopCommands(client)
    return commands


async def loop_redis_close() -> None:
    """Close the loop's clients (the worker is stopping), each after the batch on its way; from
    now on ``loop_redis_commands`` gives None. On another loop than the clients', nothing is
    closed."""
    state = _state
    if state.loop is not None and asyncio.get_running_loop() is not state.loop:
        return
    state.closed = True
    clients, state.clients = state.clients, {}
    for commands in clients.values():
        await commands.close()
