"""The event loop a chatsite worker runs on: uvloop where it is installed, else asyncio's own.

Daphne runs Twisted's asyncio reactor on an event loop it makes when ``daphne.server`` is first
imported, from the event loop policy of that moment; ``chatsite.server`` calls
``event_loop_install`` before that import. Every frame of every stream goes through that loop
(Twisted's writes are its add_writer/remove_writer calls, each timer and task step is one of
its rounds), and uvloop's rounds cost less CPU than asyncio's (docs/performance.md).

``CHATSITE_EVENT_LOOP``: ``uvloop`` (the default; asyncio's loop where uvloop cannot be
imported) or ``asyncio``. Read from the environment, not Django's settings: the loop is chosen
before Django is set up.

Daphne makes its loop itself (``asyncio.new_event_loop()`` as ``daphne.server`` is imported), so
the event loop policy is the only way in. Policies are deprecated from Python 3.14 (uvloop's
goes with 3.16): a later Python needs Daphne to take a loop factory instead.
"""

import asyncio
import os

CHOICES = ("uvloop", "asyncio")


def event_loop_wanted() -> str:
    """The loop ``CHATSITE_EVENT_LOOP`` asks for; ``ValueError`` for anything else."""
    wanted = os.environ.get("CHATSITE_EVENT_LOOP", "uvloop").strip().lower() or "uvloop"
    if wanted not in CHOICES:
        raise ValueError(f"CHATSITE_EVENT_LOOP must be one of {', '.join(CHOICES)}: {wanted!r}")
    return wanted


def event_loop_install() -> str:
    """Make the event loops made from now on uvloop's, if wanted and installed; which it is."""
    if event_loop_wanted() == "uvloop":
        try:
            import uvloop
        except ImportError:
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    return "asyncio"


def event_loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: what ``loop`` is, for the worker's start-up line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
