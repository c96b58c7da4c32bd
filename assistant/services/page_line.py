"""How many of Django's requests a worker runs at once, and the line in front of them.

Under ASGI, every request that reaches synchronous code (a page view, the session middleware)
runs on a thread of its own (Django gives each request its own thread-sensitive context), and
each such thread holds one of the database pool's few connections for as long as it runs. A
burst of first visits would start a thread for each: a thousand threads waiting for eight
connections, and after CHATSITE_DB_POOL_TIMEOUT most would fail.

So a worker runs at most ``AT_ONCE`` of them (``CHATSITE_PAGES_AT_ONCE``); the others wait their
turn, first come first served, for up to ``WAIT_S`` (``CHATSITE_PAGES_WAIT_S``). One still
waiting then is refused, 503 ``site_busy``, with a Retry-After spread over a few seconds, so
that those refused together do not all come back together. The chat stream's own consumer does
not pass here (it reads the database on threads of its own, assistant/db.py), nor do the health
probes; the Django serving path's stream (``/api/chat/stream/django``) does, as a Django view.
A turn ends when the request's work does, even when its client left before (the middleware).
"""

import asyncio
import weakref
from dataclasses import dataclass, field

from django.conf import settings

from assistant import errors
from assistant.errors import Rejected

#: The Retry-After of a request refused here: between these many seconds, at random.
RETRY_S = (2, 6)


@dataclass(slots=True)
class PageLine:
    """The requests running (at most ``at_once``) and those waiting, in one event loop."""

    at_once: int
    wait_s: float
    running: int = 0
    waiting: int = 0
    _turns: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._turns = asyncio.Semaphore(self.at_once)

    async def enter(self) -> bool:
        """Take a turn, waiting up to ``wait_s``; False when none came in time."""
        if not self._turns.locked():
            await self._turns.acquire()  # free: returns at once
        else:
            self.waiting += 1
            try:
                async with asyncio.timeout(self.wait_s):
                    await self._turns.acquire()
            except TimeoutError:
                return False
            finally:
                self.waiting -= 1
        self.running += 1
        return True

    def leave(self) -> None:
        self.running -= 1
        self._turns.release()


_lines: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, PageLine]" = (
    weakref.WeakKeyDictionary()
)


def page_line() -> PageLine | None:
    """This event loop's line; None when CHATSITE_PAGES_AT_ONCE is 0 (no limit)."""
    config = settings.CHATSITE_PAGES
    if not config["AT_ONCE"]:
        return None
    loop = asyncio.get_running_loop()
    line = _lines.get(loop)
    if line is None or line.at_once != config["AT_ONCE"] or line.wait_s != config["WAIT_S"]:
        line = _lines[loop] = PageLine(config["AT_ONCE"], config["WAIT_S"])
    return line


def site_busy() -> Rejected:
    """What a request that waited too long is told."""
    return Rejected.spread(errors.SITE_BUSY, *RETRY_S)
