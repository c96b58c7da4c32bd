"""Redis from the event loop: the round trips every answer makes at its start and its end,
without a thread.

A command sent from a database thread (``assistant.db.run_db``) costs that thread's wake-up and,
when Redis answers, the GIL back from the event loop: with fifty commands at once, 110-149 µs of
the worker's CPU a command on this machine, where they cost far less sent from the loop
(``benchmarks/stream_slots.py``). In the production profile a new question's session read and
try for a stream slot (``services/loop_admission.py``), and every answer's give-back of its slot
before its last frame (``services/stream_slots.py``), are sent from here.

The commands go in batches (``LoopCommands``, ``assistant/loop_batches.py``): those asked for
while a batch is on its way go together in the next, written at once: one round trip, on a
connection of the loop's own that speaks Redis's protocol and no more (``assistant/loop_resp.py``;
redis-py's pipeline cost several times its CPU). On a busy
loop a reply waits for the loop's turn however fast Redis is, so commands sent one by one on a
few connections would queue for a connection (at a thousand students, their give-backs waited
seconds); a batch takes whatever waits, on one connection, and the busier the loop the more each
round trip carries.

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
from typing import Any

from assistant.loop_batches import LoopBatches
from assistant.loop_resp import RespConnection, resp_connect

#: What its connections are called in Redis's ``CLIENT LIST``, before the worker's process id.
LOOP_CLIENT_NAME = "chatsite-loop"
#: How long a stopping worker waits for the batch on its way before it closes the connection.
CLOSE_WAIT_S = 2.0
#: How long a batch may take, the connection opened included, before its commands fail (and the
#: connection is opened again for the next): a Redis that stopped answering holds no question
#: longer than this (the callers then go to a thread, or log it).
BATCH_TIMEOUT_S = 3.0


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


class LoopCommands(LoopBatches[tuple[Any, ...], Any]):
    """Commands to one Redis from the event loop, sent in batches (``LoopBatches``) on one
    connection (``assistant/loop_resp.py``): ``send`` queues one; those queued while a batch is
    on its way go in the next, written at once (one round trip)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self._connection: RespConnection | None = None
        #: Batches sent, and commands in them (what a test or a benchmark reads).
        self.batches = 0
        self.commands = 0

    def send(self, *command: Any) -> "asyncio.Future[Any]":
        """Queue ``command`` (``"ZREM", key, member``); its reply, or the error Redis or the
        connection gave, comes in the future."""
        return self.ask(command)

    @property
    def connected(self) -> bool:
        """Whether its connection is open (kept between batches)."""
        return self._connection is not None and self._connection.usable

    def _within_s(self) -> float:
        return BATCH_TIMEOUT_S

    async def _round_trip(self, batch: list[tuple[Any, ...]]) -> list[Any]:
        connection = await self._connected()
        self.batches += 1
        self.commands += len(batch)
        return await connection.batch(batch)

    async def _connected(self) -> RespConnection:
        connection = self._connection
        if connection is None or not connection.usable:
            name = f"{LOOP_CLIENT_NAME}-{os.getpid()}"
            connection = self._connection = await resp_connect(self.url, name=name)
        return connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    async def close(self) -> None:
        """Wait for the batch on its way, if any (at most ``CLOSE_WAIT_S``: a Redis that does
        not answer does not hold the worker up), then close the connection."""
        await self._sent(CLOSE_WAIT_S)
        connection = self._connection
        await self._drop()
        if connection is not None:
            await connection.closed(CLOSE_WAIT_S)


def loop_may_have_clients() -> bool:
    """Whether the running loop is the server's, which may keep clients of its own: this one's
    Redis clients, and its PostgreSQL reads (``assistant/loop_postgres.py``). The first loop to
    ask in a server process is its; any other, or any loop once the worker stops, has none."""
    state = _state
    if not state.allowed or state.closed:
        return False
    loop = asyncio.get_running_loop()
    if state.loop is None:
        state.loop = loop
    return loop is state.loop


def loop_redis_commands(url: str) -> LoopCommands | None:
    """The running loop's commands to the Redis at ``url``, its client made on first use; None
    where the loop may have none (see the module docstring)."""
    if not loop_may_have_clients():
        return None
    state = _state
    commands = state.clients.get(url)
    if commands is None:
        commands = state.clients[url] = LoopCommands(url)
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
