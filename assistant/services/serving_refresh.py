"""Each process's background loop over the split: refresh its copy, and run the breaker.

One task per event loop, started by the first request that routes by the split
(``split_current``): it reads the stored split every ``REFRESH_S`` seconds into
``serving.current`` and evaluates the breaker (``services/breaker.py``) every ``EVALUATE_S``.
"""

import asyncio
import logging

from django.conf import settings

from assistant.db import run_db, run_db_write
from assistant.models import ServingState
from assistant.services.breaker import breaker_evaluate
from assistant.services.serving import current, split_load
from assistant.services.serving_state import Split, split_from

logger = logging.getLogger(__name__)


class _Refresher:
    """This loop's refresher task, and the first read the first request waits for."""

    task: asyncio.Task[None] | None = None
    loaded: asyncio.Future[None] | None = None


_refresher = _Refresher()


async def split_current() -> Split:
    """The split to route by: from memory, refreshed in the background.

    The first call in a process (or event loop) waits for one read; the rest never touch the
    database.
    """
    split = current.split
    task = _refresher.task
    if (
        split is not None
        and task is not None
        and not task.done()
        and task.get_loop() is asyncio.get_running_loop()
    ):
        return split
    _refresh_start()
    loaded = _refresher.loaded
    assert loaded is not None
    if split is None:
        await asyncio.shield(loaded)
    return current.split or split_from(ServingState())


def _refresh_start() -> None:
    """Start this loop's refresher (and breaker evaluator) unless it runs already."""
    task = _refresher.task
    loop = asyncio.get_running_loop()
    if task is not None and not task.done() and task.get_loop() is loop:
        return
    _refresher.loaded = loop.create_future()
    _refresher.task = loop.create_task(_refresh_loop(_refresher.loaded), name="chatsite-serving")


async def _refresh_loop(loaded: asyncio.Future[None]) -> None:
    config = settings.CHATSITE_SERVING
    every = settings.CHATSITE_BREAKER["EVALUATE_S"]
    loop = asyncio.get_running_loop()
    next_evaluation = loop.time() + every
    while True:
        try:
            current.split = await run_db(split_load)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The database is down or busy: keep routing by the last copy, try again later.
            logger.exception("Could not refresh the serving split")
        if not loaded.done():
            loaded.set_result(None)  # the first request waits for this one read, no more
        try:
            if loop.time() >= next_evaluation:
                next_evaluation = loop.time() + every
                await run_db_write(breaker_evaluate)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Could not evaluate the serving breaker")
        await asyncio.sleep(config["REFRESH_S"])
