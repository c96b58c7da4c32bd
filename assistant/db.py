"""Database access from async code, off the event loop and off Django's single sync thread.

The async ORM methods (``aget``, ``acreate``) run on one thread shared by every request
(``thread_sensitive=True``), so with fifty streams open each query waits behind the others.
Stream persistence is short, independent work: it runs on the default executor's threads instead,
each with its own connection, cleaned up like Django's request cycle does.
"""

from collections.abc import Callable
from functools import partial

from asgiref.sync import sync_to_async
from django.db import close_old_connections


def _with_connection_hygiene[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


async def run_db[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the synchronous ``func`` (ORM work) on a worker thread and await its result."""
    call = partial(_with_connection_hygiene, func, *args, **kwargs)
    return await sync_to_async(call, thread_sensitive=False)()
