"""The ASGI lifespan protocol, for a server that speaks it (uvicorn; Daphne does not).

At shutdown such a server first stops accepting and lets the open requests end (uvicorn: for up
to ``--timeout-graceful-shutdown`` seconds, which ``chatsite.uvicorn_server`` sets from
``CHATSITE_DRAIN_S``, then cancels them, and each cancelled answer stops
and stores what was said). Then it sends ``lifespan.shutdown``: the answers those requests leave
behind (a detached one kept for a resume, the stores of those just ended) are stopped and
stored here before the process exits, within ``SHUTDOWN_STORE_S``, as Daphne's shutdown does
through ``internals.await_at_shutdown``. Last, the worker's event loop closes its Redis client
(``assistant/loop_redis.py``) and its PostgreSQL connection (``assistant/loop_postgres.py``).
"""

from typing import Any

from assistant.loop_postgres import loop_postgres_close
from assistant.loop_redis import loop_redis_close
from assistant.services.background import drain
from assistant.services.telemetry import ends_flush

#: How long the answers left at shutdown have to be stored (the same bound as under Daphne).
SHUTDOWN_STORE_S = 5.0


async def lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ``lifespan`` scope's application: nothing to do at startup (``chatsite.asgi`` loads
    everything on import), the answers left stored at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await worker_stopping()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def worker_stopping() -> None:
    """A worker's last work, under either server: the answers left stored (within
    ``SHUTDOWN_STORE_S``) and observed (their metrics and log lines, ``ends_flush``), then its
    event loop's Redis client and PostgreSQL connection closed."""
    await drain(within_s=SHUTDOWN_STORE_S)
    ends_flush()
    await loop_redis_close()
    await loop_postgres_close()
