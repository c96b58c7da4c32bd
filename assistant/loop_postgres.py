"""PostgreSQL from the event loop: the reads on the way to a first token, without a thread.

A continued conversation's question needs its history before the engine starts. Read through
the ORM it goes to a database thread (``assistant.db.run_db``), with the thread's wake-up and the
GIL back from the event loop when the rows come, on top of Django's query compilation. The
server's event loop reads it itself here, by a connection of its own, with a query written once
(``services/conversations.py: history_on_loop``).

The reads go in batches (``LoopReads``, ``assistant/loop_batches.py``), as
``assistant/loop_redis.py``'s commands do: those asked for while a batch is on its way go
together in the next, one pipeline on one connection (psycopg's pipeline mode, one round trip),
so a busy loop's reads do not queue one by one for a connection behind its turns.

Only the server's loop has the connection (``loop_redis.loop_may_have_clients``: the first loop
of a process whose entry point allowed it, ``chatsite.uvicorn_server``), and only where Django's
database is PostgreSQL. It is opened on first use with Django's connection settings (the same
database, user and options), in autocommit and named ``chatsite-loop-<pid>`` in
``pg_stat_activity``; the worker closes it as it stops (``lifespan.worker_stopping``). Anywhere
else ``loop_reads`` gives None and the caller reads on a thread as before. A read that fails
(the connection lost, the server restarting) fails its batch, the connection is opened again for
the next one, and each caller goes to a thread, which answers, or fails, as it always has.
"""

import asyncio
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from assistant.loop_batches import LoopBatches
from assistant.loop_redis import LOOP_CLIENT_NAME, loop_may_have_clients

if TYPE_CHECKING:
    from psycopg import AsyncConnection

#: How long a stopping worker waits for the batch on its way before it closes the connection.
CLOSE_WAIT_S = 2.0
#: How long opening the connection may take before the batch's reads go to a thread.
CONNECT_TIMEOUT_S = 2
#: How long a batch may take, the connection opened included, before its reads go to a thread
#: (and the connection is opened again for the next): a database that stopped answering holds
#: no question longer than this.
BATCH_TIMEOUT_S = 3.0

Rows = list[tuple[Any, ...]]


class LoopReads(LoopBatches[tuple[str, Sequence[Any]], Rows]):
    """Queries to one database from the event loop, sent in batches (``LoopBatches``): ``rows``
    queues one; those queued while a batch is on its way go in the next, one pipeline (one round
    trip)."""

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__()
        self._params = params
        self.loop = asyncio.get_running_loop()
        self._connection: AsyncConnection[Any] | None = None
        #: Batches sent, and reads in them (what a test or a benchmark reads).
        self.batches = 0
        self.reads = 0

    def rows(self, sql: str, params: Sequence[Any]) -> "asyncio.Future[Rows]":
        """Queue ``sql`` with its ``params`` (``%s`` placeholders); its rows, or the error the
        server or the connection gave, come in the future."""
        return self.ask((sql, params))

    def _within_s(self) -> float:
        return BATCH_TIMEOUT_S

    async def _round_trip(self, batch: list[tuple[str, Sequence[Any]]]) -> list[Rows]:
        connection = await self._connected()
        self.batches += 1
        self.reads += len(batch)
        cursors = []
        async with connection.pipeline():
            for sql, params in batch:
                cursor = connection.cursor()
                await cursor.execute(sql, params)
                cursors.append(cursor)
        return [await cursor.fetchall() for cursor in cursors]

    async def _connected(self) -> "AsyncConnection[Any]":
        connection = self._connection
        if connection is None or connection.closed:
            from psycopg import AsyncConnection

            params = {
                "connect_timeout": CONNECT_TIMEOUT_S,
                **self._params,
                "autocommit": True,
                "application_name": f"{LOOP_CLIENT_NAME}-{os.getpid()}",
            }
            connection = self._connection = await AsyncConnection.connect(**params)
        return connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except Exception:
                pass  # it is gone either way

    async def close(self) -> None:
        """Wait for the batch on its way, if any (at most ``CLOSE_WAIT_S``), then close the
        connection."""
        await self._sent(CLOSE_WAIT_S)
        await self._drop()


class _LoopDatabase:
    """The server loop's reads, made on first use."""

    def __init__(self) -> None:
        self.reads: LoopReads | None = None
        #: Closed as the worker stops, or never to be made: the database is not PostgreSQL.
        self.closed = False


_state = _LoopDatabase()


def loop_reads() -> LoopReads | None:
    """The running loop's reads from Django's database, made on first use; None where the loop
    may have none, or the database is not PostgreSQL (see the module docstring)."""
    state = _state
    if state.reads is not None:
        return state.reads if loop_may_have_clients() else None
    if state.closed or not loop_may_have_clients():
        return None
    params = _connection_params()
    if params is None:
        state.closed = True  # asked once: the settings do not change
        return None
    state.reads = LoopReads(params)
    return state.reads


def _connection_params() -> dict[str, Any] | None:
    """Django's connection settings for its default database, as psycopg takes them (its
    adapters included, its cursor class not: that one is synchronous); None when the database
    is not PostgreSQL."""
    from django.db import connections

    wrapper = connections.create_connection("default")  # settings only: nothing is opened
    if wrapper.vendor != "postgresql":
        return None
    params = dict(wrapper.get_connection_params())
    params.pop("cursor_factory", None)
    return params


async def loop_postgres_close() -> None:
    """Close the loop's connection (the worker is stopping), after the batch on its way; from
    now on ``loop_reads`` gives None. On another loop than the connection's, nothing is
    closed."""
    state = _state
    if state.reads is not None and asyncio.get_running_loop() is not state.reads.loop:
        return
    state.closed = True
    reads, state.reads = state.reads, None
    if reads is not None:
        await reads.close()
