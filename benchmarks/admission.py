"""What admitting a new question costs the worker: on the local profile on the event loop
(``answer_start._page_admitted_now``, what ``Asking.admit_now`` runs) and, beside it, on a reader
thread (``_page_admitted`` through ``assistant.db.run_db``, where every question went before);
with ``--production``, on PostgreSQL and Redis, by the event loop's own Redis client
(``loop_admission.page_admission_on_loop``, what ``Asking.admit_on_loop`` runs under uvicorn)
and on a reader thread.

An admission is who is asking (their session, in the cache), their class, their rate counted and
a stream slot taken; the slot is given back after. Each runs in a task of a new, empty context,
as a server starts each request's task: what Django makes for a context of its own (a cache
object, looked up through ``caches``) is paid as a request pays it. ``--at-once`` admissions run
at a time. A figure is the process's CPU per admission, with what the same number of empty tasks
cost taken off; the median over ``--rounds`` rounds, and their spread; beside it, the median time
an admission took from its start to its answer (its round trips, waited for one after another,
and its turns of the loop). A question says what its page showed of the class, as the page does
(``"class"``, ``"teachers_read"``). The local profile runs on
a SQLite database and a local-memory cache of the run's own; ``--production`` on the PostgreSQL
database of ``DATABASE_URL`` (migrated; a class and its sessions are added) and the Redis of
``CHATSITE_REDIS_URL``, under a key prefix of the run's own, deleted after. There the students
are in a class (``--in-class``, as the capacity benchmark's are) or in none; PostgreSQL's and
Redis's own CPU is not counted, only this process's. With ``--continued`` each question continues
a conversation of its student's (``--history`` messages stored): its owner is checked and its
history read too, by the loop's own PostgreSQL connection (``assistant/loop_postgres.py``) or on
the thread.

    python benchmarks/admission.py [--admissions 3000] [--rounds 7] [--at-once 1 20]
    DATABASE_URL=postgres://... CHATSITE_REDIS_URL=redis://... \
        python benchmarks/admission.py --production [--in-class] [--continued [--history 6]]
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
PRODUCTION = "--production" in sys.argv
if PRODUCTION:
    if not (os.environ.get("DATABASE_URL") and os.environ.get("CHATSITE_REDIS_URL")):
        sys.exit("--production needs DATABASE_URL and CHATSITE_REDIS_URL")
    os.environ["CHATSITE_REDIS_PREFIX"] = f"bench-admission-{uuid.uuid4().hex[:8]}"
else:
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

from assistant import loop_postgres, loop_redis  # noqa: E402
from assistant.db import run_db  # noqa: E402
from assistant.models import Classroom, Conversation, Message  # noqa: E402
from assistant.services.admission import chat_release  # noqa: E402
from assistant.services.answer_start import _page_admitted, _page_admitted_now  # noqa: E402
from assistant.services.chat_request import ChatTurn, chat_turn_parse  # noqa: E402
from assistant.services.classrooms import SESSION_CLASS  # noqa: E402
from assistant.services.identity import owner_key_for  # noqa: E402
from assistant.services.loop_admission import page_admission_on_loop  # noqa: E402

#: Sessions the admissions take turns with (a local-memory cache keeps 300 entries: these and
#: their rate counts stay in it).
SESSIONS = 50

Admit = Callable[[str, ChatTurn, str], Awaitable[str]]
#: Each admission's time from its start to its answer, in seconds, in the round running.
TOOK: list[float] = []


async def on_the_loop(key: str, turn: ChatTurn, request_id: str) -> str:
    found = _page_admitted_now(key, turn, request_id)
    if found is None:
        raise RuntimeError("the session was not found in memory: not the local profile")
    return found[0].owner_key


async def by_the_loops_client(key: str, turn: ChatTurn, request_id: str) -> str:
    on_loop = page_admission_on_loop(
        key, turn.conversation_id, turn.replaces, turn.shown, request_id
    )
    found = None if on_loop is None else await on_loop
    if found is None:
        raise RuntimeError("the loop could not admit it: not the production profile's Redis")
    return found[0].owner_key


async def on_a_thread(key: str, turn: ChatTurn, request_id: str) -> str:
    identity, _, _ = await run_db(_page_admitted, key, turn, request_id)
    return identity.owner_key


async def admissions(
    admit: Admit | None, keys: list[str], turns: list[ChatTurn], count: int, at_once: int
) -> None:
    """``count`` admissions (None: empty tasks), ``at_once`` at a time, each in a task of a new
    context; each admission's slot is given back. Session ``i`` asks ``turns[i]``."""
    loop = asyncio.get_running_loop()

    async def one(n: int) -> None:
        if admit is None:
            return
        request_id = uuid.uuid4().hex
        started = time.perf_counter()
        owner_key = await admit(keys[n % len(keys)], turns[n % len(keys)], request_id)
        TOOK.append(time.perf_counter() - started)
        if PRODUCTION:
            await run_db(chat_release, owner_key=owner_key, request_id=request_id)
        else:
            chat_release(owner_key=owner_key, request_id=request_id)

    # A server's loop: its own Redis client and PostgreSQL connection, opened now and closed
    # as the round ends.
    loop_redis._state = loop_redis._LoopClients()
    loop_postgres._state = loop_postgres._LoopDatabase()
    loop_redis.loop_redis_allow()
    try:
        for start in range(0, count, at_once):
            tasks = [
                loop.create_task(one(n), context=contextvars.Context())
                for n in range(start, min(count, start + at_once))
            ]
            await asyncio.gather(*tasks)
    finally:
        await loop_redis.loop_redis_close()
        await loop_postgres.loop_postgres_close()


def round_cpu(
    admit: Admit | None, keys: list[str], turns: list[ChatTurn], count: int, at_once: int
) -> float:
    started = time.process_time()
    uvloop.run(admissions(admit, keys, turns, count, at_once))
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--admissions", type=int, default=3000, help="per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--at-once", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--production", action="store_true", help="PostgreSQL and Redis")
    parser.add_argument("--in-class", action="store_true", help="the students in one class")
    parser.add_argument(
        "--continued", action="store_true", help="each question continues a conversation"
    )
    parser.add_argument("--history", type=int, default=6, help="messages in each conversation")
    args = parser.parse_args()
    if args.continued and not PRODUCTION:
        sys.exit("--continued needs --production: the local profile admits it on a thread only")

    call_command("migrate", verbosity=0)
    # No rate limit or cap met here: every admission takes the whole way.
    settings.CHATSITE_RATE_LIMITS = {**settings.CHATSITE_RATE_LIMITS, "chat": (10**9, 60)}
    settings.CHATSITE_STREAM = {**settings.CHATSITE_STREAM, "STREAMS_PER_SESSION": 10**6}
    classroom = None
    if args.in_class:
        code = uuid.uuid4().hex[:12]
        classroom = Classroom.objects.create(name=f"bench {code}", join_code=code)
    keys = []
    for _ in range(SESSIONS):
        session = SessionStore()
        session["created"] = True
        if classroom is not None:
            session[SESSION_CLASS] = str(classroom.pk)
        session.save()
        keys.append(session.session_key)
    turns = [
        _turn(_conversation(key, classroom, args.history) if args.continued else None, classroom)
        for key in keys
    ]
    ways: dict[str, Admit] = {"loop": on_the_loop, "thread": on_a_thread}
    if PRODUCTION:
        ways = {"loop's own clients": by_the_loops_client, "thread": on_a_thread}
        # The class read once on a thread, as a worker's first question of it is.
        uvloop.run(on_a_thread(keys[0], _turn(None, classroom), uuid.uuid4().hex))
    try:
        _measure(args, keys, turns, ways)
    finally:
        if PRODUCTION:
            _forget(keys, classroom)


def _turn(conversation: uuid.UUID | None, classroom: Classroom | None) -> ChatTurn:
    body: dict[str, object] = {
        "message": "What is photosynthesis?",
        "class": None if classroom is None else str(classroom.pk),
        "teachers_read": False if classroom is None else classroom.teachers_read,
    }
    if conversation is not None:
        body["conversation"] = str(conversation)
    return chat_turn_parse(json.dumps(body).encode())


def _conversation(key: str, classroom: Classroom | None, messages: int) -> uuid.UUID:
    """A conversation of ``key``'s student, with ``messages`` questions and answers stored."""
    conversation = Conversation.objects.create(
        owner_key=owner_key_for(None, key), classroom=classroom, title="bench"
    )
    for i in range(messages):
        role = Message.Role.ASSISTANT if i % 2 else Message.Role.USER
        Message.objects.create(conversation=conversation, role=role, content=f"message {i} " * 20)
    return conversation.pk


def _forget(keys: list[str], classroom: Classroom | None) -> None:
    """The run's sessions, class and Redis keys."""
    import redis

    for key in keys:
        Conversation.objects.filter(owner_key=owner_key_for(None, key)).delete()
        SessionStore(key).delete()
    if classroom is not None:
        classroom.delete()
    client = redis.Redis.from_url(os.environ["CHATSITE_REDIS_URL"])
    found = list(client.scan_iter(match=f"{os.environ['CHATSITE_REDIS_PREFIX']}:*"))
    if found:
        client.delete(*found)
    client.close()


def _measure(
    args: argparse.Namespace, keys: list[str], turns: list[ChatTurn], ways: dict[str, Admit]
) -> None:
    print(f"Rounds: {args.rounds} of {args.admissions} admissions; us of CPU per admission")
    print("at once | way | median (min-max) | us an admission took, median (rounds' min-max)")
    for at_once in args.at_once:
        figures: dict[str, list[float]] = {way: [] for way in ways}
        took: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            empty = round_cpu(None, keys, turns, args.admissions, at_once)
            for way, admit in ways.items():
                TOOK.clear()
                spent = round_cpu(admit, keys, turns, args.admissions, at_once) - empty
                figures[way].append(spent / args.admissions * 1e6)
                took[way].append(statistics.median(TOOK) * 1e6)
        for way, values in figures.items():
            print(
                f"{at_once} {way} {statistics.median(values):.1f} "
                f"({min(values):.1f}-{max(values):.1f}) | {statistics.median(took[way]):.0f} "
                f"({min(took[way]):.0f}-{max(took[way]):.0f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
