"""Work that must finish even when the request that started it is gone.

asyncio keeps only weak references to tasks; a task nobody holds can vanish mid-flight. Saving a
partial answer after a disconnect is exactly such a task, so every one is held here until done.
"""

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

logger = logging.getLogger(__name__)

_tasks: set[asyncio.Task[Any]] = set()


def spawn[T](coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _tasks.add(task)
    task.add_done_callback(_finished)
    return task


#: Adopted tasks: running answers (``Answer.run``), stopped first when the process exits.
_adopted: set[asyncio.Task[Any]] = set()


def adopt(task: asyncio.Task[Any]) -> None:
    """Hold ``task`` (one running an answer, which nobody may be listening to) until it is
    done, like a spawned one; when the process shuts down it is cancelled, then waited for."""
    _adopted.add(task)
    if task not in _tasks:
        _tasks.add(task)
        task.add_done_callback(_finished)


async def drain(within_s: float) -> int:
    """At shutdown: stop adopted answers, then wait up to ``within_s`` seconds for the rest
    (storing answers and records). Returns how many tasks were still unfinished."""
    for task in list(_adopted):
        task.cancel()
    pending = {task for task in _tasks if not task.done()}
    if not pending:
        return 0
    # Tasks spawned while draining (the stores of the answers just stopped) are waited for too.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while pending and loop.time() < deadline:
        await asyncio.wait(pending, timeout=deadline - loop.time())
        pending = {task for task in _tasks if not task.done()}
    if pending:
        logger.error("Shutting down with %d unfinished background tasks", len(pending))
    return len(pending)


def failure_taken(done: "asyncio.Future[Any]") -> None:
    """A done callback for a future nobody awaits: its exception, if any, is retrieved, so
    asyncio does not log it as never retrieved. Whoever failed logs and counts it."""
    if not done.cancelled():
        done.exception()


def _finished(task: asyncio.Task[Any]) -> None:
    _tasks.discard(task)
    _adopted.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("Background task %s failed", task.get_name(), exc_info=task.exception())


#: Set when the worker was asked to stop and drains (``chatsite/server.py``).
_draining = False


def drain_begin() -> None:
    """The worker drains: streams that never end on their own (the staff dashboard's) end at
    their next step, so the drain need not wait for them."""
    global _draining
    _draining = True


def draining() -> bool:
    return _draining
