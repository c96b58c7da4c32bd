"""Database access from async code, off the event loop and off Django's single sync thread.

The async ORM methods (``aget``, ``acreate``) run on one thread shared by every request
(``thread_sensitive=True``), so with fifty streams open each query waits behind the others.
chatsite's queries are short and independent, so they run on two small pools of their own:

* ``run_db`` for reads on the path to the first token (session, history): they never wait
  behind a write;
* ``run_db_write`` for persistence after the first token: one writer by default, which is all
  SQLite can use at once anyway, so writers queue in memory instead of spinning on the file lock;
* ``run_db_bulk`` for long reads a person waits for (a class's CSV export), on a thread of their
  own.

Each call is wrapped like Django's request cycle: stale connections are closed before and after,
and persistent connections (``CONN_MAX_AGE``) are reused between calls on the same thread.

The cache is reached the same way, through ``run_cache``. Django keeps a cache object per
thread, and on the event loop one per task (each task's context is its own): ``cache.get``
looked up on the event loop makes a new one for each request. Looked up on a reader thread, it
is that thread's. (The production profile's Redis cache objects share one client and its
connections either way: ``assistant/cache.py``.)
"""

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import close_old_connections

_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(kind: str) -> ThreadPoolExecutor:
    pool = _pools.get(kind)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(kind)
            if pool is None:
                size = settings.CHATSITE_DB_THREADS[kind]
                pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"db-{kind}")
                _pools[kind] = pool
    return pool


def _with_connection_hygiene[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


async def _run[**P, R](kind: str, func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    # Plain run_in_executor: asgiref's sync_to_async does the same with far more bookkeeping,
    # and none of it (thread-sensitive routing, context propagation) is needed here.
    call = partial(_with_connection_hygiene, func, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool(kind), call)


async def run_db[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the synchronous read ``func`` (ORM work) on a reader thread and await its result."""
    return await _run("read", func, *args, **kwargs)


async def run_db_bulk[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the synchronous long read ``func`` (an export) on its own thread, never ahead of the
    students' reads."""
    return await _run("bulk", func, *args, **kwargs)


async def run_db_write[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the synchronous write ``func`` on a writer thread and await its result."""
    return await _run("write", func, *args, **kwargs)


def _cache_call(method: str, *args: Any) -> Any:
    return getattr(cache, method)(*args)


async def run_cache(method: str, *args: Any) -> Any:
    """``cache.<method>(*args)`` on a reader thread, with that thread's own cache object."""
    return await run_db(_cache_call, method, *args)
