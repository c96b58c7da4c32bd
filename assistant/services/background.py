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


def adopt(task: asyncio.Task[Any]) -> None:
    """Hold ``task`` (started elsewhere) until it is done, like a spawned one."""
    if task not in _tasks:
        _tasks.add(task)
        task.add_done_callback(_finished)


def _finished(task: asyncio.Task[Any]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("Background task %s failed", task.get_name(), exc_info=task.exception())
