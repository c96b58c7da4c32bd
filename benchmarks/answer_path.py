"""chatsite's own work per answer, with no server: the ASGI application called in this process.

Servers cost CPU of their own, and on a shared machine a server's figures move from run to run
(benchmarks/cost_per_answer.py measures them in interleaved rounds for that reason). This calls
``chatsite.asgi.application`` directly, as a server would, for one session's questions on the
``direct`` path with the scripted engine (``--tokens`` tokens each, at no delay unless
``--ttft-ms``/``--itl-ms`` give the engine's waits, which wake each answer from a timer per token
as on a server), and reads the process's CPU time (every thread: the database threads' work
counts) around ``--answers`` answers, ``--concurrency`` at a time. What it measures is
everything chatsite does for an answer (routing, CSRF, the session and admission read, the
engine's stream, frames, the resume buffer, the slow-reader check where a connection is found,
which here it is not, persistence, metrics) and nothing of a server's: no socket, no parsing
of HTTP.

``--stores production`` keeps what an answer stores where the production profile does: in a
PostgreSQL database made for the run (at ``--postgres``, dropped after) and in Redis (sessions,
rate limits and stream slots, under a prefix of the run's own, deleted after), and talks to them
as the production worker does (``chatsite.uvicorn_server``): a question's admission and an
answer's give-back of its slot from the event loop's own connections. Their own CPU is not
counted, only what this process spends talking to them. The default, ``local``, is SQLite
and this process's memory.

Each round also says what the group writer spent of it: its batches (rows submitted while one
is written go into the next, and with ``CHATSITE_PERSIST_BATCH_FROM`` answers running a batch is
taken at most once every ``CHATSITE_PERSIST_BATCH_MS``) and the CPU of the thread writing them,
per answer. A round's clocks stop once every row its answers handed over is stored
(``background.drain``): the writing is counted in the round whose answers made it, however the
writer batched it.

``--without-hiredis`` hides hiredis from redis-py (its own Python parser and command packer
then serve), to measure what the C one saves on the production stores.

``--profile`` runs the same answers again under cProfile and prints the functions with the most
time of their own, and chatsite's by the time spent in them and what they call. Times under the
profiler are inflated; its call counts are exact.

    python benchmarks/answer_path.py [--answers 2000] [--tokens 20] [--concurrency 1]
                                     [--rounds 3] [--ttft-ms 0] [--itl-ms 0] [--profile]
                                     [--stores local|production] [--without-hiredis]

Each answer's log line goes to stderr, as a worker's does: ``CHATSITE_LOG_LEVEL=WARNING``
quiets them.
"""

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assistant.benchmarking.servers import BENCHMARK_ENV  # noqa: E402
from benchmarks.added_latency import database_migrate  # noqa: E402

HOST = b"127.0.0.1:8000"


def scope_for(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", HOST), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def call(app: Any, scope: dict[str, Any], body: bytes = b"") -> tuple[int, list, bytes]:
    """One request to ``app`` as a server makes it: its status, headers and whole body. The
    client leaves (``http.disconnect``) once the response has ended."""
    ended = asyncio.Event()
    sent = False
    status, headers, chunks = 0, [], []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], message.get("headers", [])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                ended.set()

    await app(scope, receive, send)
    return status, headers, b"".join(chunks)


async def session_cookies(app: Any) -> dict[str, str]:
    """The cookies a first visit to the page sets (the session and the CSRF token)."""
    status, headers, _ = await call(app, scope_for("GET", "/", []))
    if status != 200:
        raise RuntimeError(f"the page answered {status}")
    cookies = {}
    for name, value in headers:
        if name.lower() == b"set-cookie":
            key, _, rest = value.decode().partition("=")
            cookies[key] = rest.split(";", 1)[0]
    return cookies


async def answers(app: Any, cookies: dict[str, str], count: int, concurrency: int) -> int:
    """``count`` answers, ``concurrency`` at a time; how many tokens they held in all."""
    cookie = "; ".join(f"{key}={value}" for key, value in cookies.items()).encode()
    body = json.dumps({"message": "What is photosynthesis?"}).encode()
    headers = [  # as the page's fetch sends them
        (b"origin", b"http://" + HOST),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cookie", cookie),
        (b"x-csrftoken", cookies["csrftoken"].encode()),
    ]
    queue = iter(range(count))
    tokens = 0

    async def student() -> None:
        nonlocal tokens
        for _ in queue:
            scope = scope_for("POST", "/api/chat/stream", headers)
            status, _, text = await call(app, scope, body)
            if status != 200 or b"event: done" not in text:
                raise RuntimeError(f"not a whole answer: {status} {text[-300:]!r}")
            tokens += text.count(b"event: token")

    await asyncio.gather(*(student() for _ in range(concurrency)))
    return tokens


def profile_show(profile: cProfile.Profile) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(str(ROOT / "assistant"), 40)
    print(out.getvalue())


class WriterClock:
    """The group writer's share: its batches and the CPU of the thread writing them (around
    ``persistence.rows_write``, which the writer calls by name)."""

    def __init__(self) -> None:
        from assistant.services import persistence

        self.batches, self.cpu = 0, 0.0
        write = persistence.rows_write

        def timed(batch: list) -> None:
            cpu = time.thread_time()
            try:
                write(batch)
            finally:
                self.cpu += time.thread_time() - cpu
                self.batches += 1

        persistence.rows_write = timed

    def take(self) -> tuple[int, float]:
        """The batches and CPU seconds since the last call."""
        taken, self.batches, self.cpu = (self.batches, self.cpu), 0, 0.0
        return taken


async def run(args: argparse.Namespace) -> None:
    from assistant.loop_redis import loop_redis_allow

    if args.stores == "production":
        # As the production worker (chatsite.uvicorn_server): admission and the slots' give-back
        # on this loop's own Redis connection, reads on its PostgreSQL one.
        loop_redis_allow()
    try:
        await answers_measured(args)
    finally:
        from assistant.loop_postgres import loop_postgres_close
        from assistant.loop_redis import loop_redis_close

        await loop_redis_close()
        await loop_postgres_close()


async def answers_measured(args: argparse.Namespace) -> None:
    from assistant.services import background
    from chatsite.asgi import application

    # isort: split
    from assistant.services.telemetry import ends_flush  # after Django is set up

    writer = WriterClock()
    cookies = await session_cookies(application)
    await answers(application, cookies, 50, args.concurrency)  # warm up
    await background.drain(within_s=60)  # the warm-up's last rows stored
    ends_flush()
    writer.take()
    for round_ in range(args.rounds):
        cpu, wall = time.process_time(), time.perf_counter()
        tokens = await answers(application, cookies, args.answers, args.concurrency)
        # The round's rows stored before its clocks stop: however the writer batched them,
        # their writing is counted in the round whose answers said them; so are their
        # metrics and log lines, observed together every so often (telemetry.stream_observe).
        await background.drain(within_s=60)
        ends_flush()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        batches, writing = writer.take()
        print(
            f"round {round_ + 1}: {args.answers} answers ({tokens / args.answers:.0f} tokens each)"
            f", {args.concurrency} at a time: {cpu * 1000 / args.answers:.3f} ms of CPU per "
            f"answer ({wall * 1000 / args.answers:.3f} ms of wall time); the group writer "
            f"{batches} batches, {writing * 1000 / args.answers:.3f} ms of CPU per answer",
            flush=True,
        )
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        await answers(application, cookies, args.answers, args.concurrency)
        profile.disable()
        profile_show(profile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--ttft-ms", type=int, default=0, help="scripted engine")
    parser.add_argument("--itl-ms", type=int, default=0, help="scripted engine")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--stores", choices=["local", "production"], default="local")
    parser.add_argument("--postgres", default=POSTGRES, help="server for --stores production")
    parser.add_argument("--without-hiredis", action="store_true")
    args = parser.parse_args()
    if args.without_hiredis:
        if "redis" in sys.modules:
            raise RuntimeError("redis-py was imported before hiredis could be hidden from it")
        sys.modules["hiredis"] = None  # type: ignore[assignment]  # so that importing it fails

    with tempfile.TemporaryDirectory(prefix="answer-path-") as folder:
        if args.stores == "local":
            measure(args, Path(folder) / "answers.sqlite3", {})
            return
        with production_stores(args.postgres) as stores:
            measure(args, Path(folder) / "unused.sqlite3", stores)


POSTGRES = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/0"


@contextlib.contextmanager
def production_stores(server: str) -> Iterator[dict[str, str]]:
    """A PostgreSQL database and a Redis prefix of the run's own (``DATABASE_URL``,
    ``CHATSITE_REDIS_URL``, ``CHATSITE_REDIS_PREFIX``), dropped and deleted after."""
    import psycopg
    import redis

    name = f"answer_path_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {
            "DATABASE_URL": f"{server}/{name}",
            "CHATSITE_REDIS_URL": REDIS_URL,
            "CHATSITE_REDIS_PREFIX": name,
        }
    finally:
        from django.db import connections

        for connection in connections.all(initialized_only=True):
            getattr(connection, "close_pool", connection.close)()
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{name}:*"))
        if keys:
            client.delete(*keys)


def measure(args: argparse.Namespace, db: Path, stores: dict[str, str]) -> None:
    """Set the benchmark's settings up on the SQLite database ``db`` (or on ``stores``, from
    ``production_stores``), then run it."""
    settings = {
        **BENCHMARK_ENV,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "CHATSITE_ENGINE": "scripted",
        "CHATSITE_SCRIPTED_TTFT_MS": str(args.ttft_ms),
        "CHATSITE_SCRIPTED_ITL_MS": str(args.itl_ms),
        "CHATSITE_SCRIPTED_TOKENS": str(args.tokens),
        "CHATSITE_SQLITE_PATH": str(db),
        "CHATSITE_MAX_STREAMS": "0",
        "CHATSITE_STREAMS_PER_ADDRESS": "0",
    }
    os.environ.update(settings | stores)
    if not stores:
        os.environ.pop("DATABASE_URL", None)
        os.environ.pop("CHATSITE_REDIS_URL", None)
    database_migrate(ROOT, dict(os.environ), db)
    from redis.utils import HIREDIS_AVAILABLE

    from chatsite.event_loop import event_loop_install

    print(f"event loop: {event_loop_install()}", flush=True)
    print(f"redis-py's parser: {'hiredis' if HIREDIS_AVAILABLE else 'Python'}", flush=True)
    if stores:
        print(f"stores: {stores['CHATSITE_REDIS_PREFIX']} (PostgreSQL database, Redis prefix)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
