"""What admitting a new question costs the worker on the local profile: on the event loop
(``answer_start._page_admitted_now``, what ``Asking.admit_now`` runs) and, beside it, on a reader
thread (``_page_admitted`` through ``assistant.db.run_db``, where every question went before).

An admission is who is asking (their session, in the cache that is this process's memory), their
class, their rate counted and a stream slot taken; the slot is given back after. Each runs in a
task of a new, empty context, as a server starts each request's task: what Django makes for a
context of its own (a cache object, looked up through ``caches``) is paid as a request pays it.
``--at-once`` admissions run at a time. A figure is the process's CPU per admission, with what
the same number of empty tasks cost taken off; the median over ``--rounds`` rounds, and their
spread. A SQLite database and a local-memory cache of the run's own, so nothing of the
checkout's is touched.

    python benchmarks/admission.py [--admissions 3000] [--rounds 7] [--at-once 1 20]
"""

import argparse
import asyncio
import contextvars
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
for variable in ("DATABASE_URL", "CHATSITE_REDIS_URL"):
    os.environ.pop(variable, None)  # the local profile: SQLite and this process's memory
os.environ["DJANGO_SETTINGS_MODULE"] = "chatsite.settings"
_folder = tempfile.TemporaryDirectory()  # removed when the run ends
os.environ["CHATSITE_SQLITE_PATH"] = str(Path(_folder.name) / "admission.sqlite3")

import django  # noqa: E402

django.setup()

import uvloop  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.sessions.backends.cached_db import SessionStore  # noqa: E402
from django.core.management import call_command  # noqa: E402

from assistant.db import run_db  # noqa: E402
from assistant.services.admission import chat_release  # noqa: E402
from assistant.services.answer_start import _page_admitted, _page_admitted_now  # noqa: E402
from assistant.services.chat_request import ChatTurn, chat_turn_parse  # noqa: E402

#: Sessions the admissions take turns with (a local-memory cache keeps 300 entries: these and
#: their rate counts stay in it).
SESSIONS = 50

Admit = Callable[[str, ChatTurn, str], Awaitable[str]]


async def on_the_loop(key: str, turn: ChatTurn, request_id: str) -> str:
    found = _page_admitted_now(key, turn, request_id)
    if found is None:
        raise RuntimeError("the session was not found in memory: not the local profile")
    return found[0].owner_key


async def on_a_thread(key: str, turn: ChatTurn, request_id: str) -> str:
    identity, _, _ = await run_db(_page_admitted, key, turn, request_id)
    return identity.owner_key


async def admissions(admit: Admit | None, keys: list[str], count: int, at_once: int) -> None:
    """``count`` admissions (None: empty tasks), ``at_once`` at a time, each in a task of a new
    context; each admission's slot is given back."""
    turn = chat_turn_parse(json.dumps({"message": "What is photosynthesis?"}).encode())
    loop = asyncio.get_running_loop()

    async def one(n: int) -> None:
        if admit is None:
            return
        request_id = uuid.uuid4().hex
        owner_key = await admit(keys[n % len(keys)], turn, request_id)
        chat_release(owner_key=owner_key, request_id=request_id)

    for start in range(0, count, at_once):
        tasks = [
            loop.create_task(one(n), context=contextvars.Context())
            for n in range(start, min(count, start + at_once))
        ]
        await asyncio.gather(*tasks)


def round_cpu(admit: Admit | None, keys: list[str], count: int, at_once: int) -> float:
    started = time.process_time()
    uvloop.run(admissions(admit, keys, count, at_once))
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admissions", type=int, default=3000, help="per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--at-once", type=int, nargs="+", default=[1, 20])
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    # No rate limit or cap met here: every admission takes the whole way.
    settings.CHATSITE_RATE_LIMITS = {**settings.CHATSITE_RATE_LIMITS, "chat": (10**9, 60)}
    keys = []
    for _ in range(SESSIONS):
        session = SessionStore()
        session["created"] = True
        session.save()
        keys.append(session.session_key)
    ways: dict[str, Admit] = {"loop": on_the_loop, "thread": on_a_thread}
    print(f"Rounds: {args.rounds} of {args.admissions} admissions; us of CPU per admission")
    print("at once | way | median (min-max)")
    for at_once in args.at_once:
        figures: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            empty = round_cpu(None, keys, args.admissions, at_once)
            for way, admit in ways.items():
                spent = round_cpu(admit, keys, args.admissions, at_once) - empty
                figures[way].append(spent / args.admissions * 1e6)
        for way, values in figures.items():
            print(
                f"{at_once} {way} {statistics.median(values):.1f} "
                f"({min(values):.1f}-{max(values):.1f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
