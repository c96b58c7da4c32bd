"""What an ended answer costs the worker: the group writer's batch and the gaps' histogram.

Two pieces of every answer's end, each beside the way it was done before:

* **The group writer** (``persistence.rows_write``): batches of ``--batch`` exchanges, each a
  new conversation, its question, its answer, the conversation's touch and the stream record,
  as the answer path submits them (three ``Rows`` per exchange), under the ids the answer path
  gives them (``ids.ordered_uuid``: version 7, in the order made). With few answers running
  the writer's batches are one or two answers; with many, a batch holds every answer that ended
  in ``CHATSITE_PERSIST_BATCH_MS`` (``persistence._pause``). The writing thread's CPU
  per exchange, on PostgreSQL (a database made for the run, dropped after) and on SQLite:
  ``one statement`` is the writer as it is (``batch_statement``: the batch in one round trip),
  ``insert per table`` the writer before it (Django's ``executemany`` INSERT per table, an
  UPDATE, then the COMMIT; still SQLite's way), ``copy per table`` the same with a ``COPY``
  per table; ``, random ids`` the writer as it is with random (version 4) ids for the rows and
  the request id, as before ``ordered_uuid``. On PostgreSQL the server's own CPU for the same
  work follows (its backend process's, from ``/proc``, in steps of the kernel's clock tick),
  then the write-ahead log it wrote per exchange (every row and index entry goes there first).
  Rounds alternate between the ways.
* **The batch handed over** (``--handed-over``, PostgreSQL only): the writer's batches as a
  worker's writer runs them, handed from an event loop to the database thread
  (``run_db_write(rows_write, ...)``: the hand-over and Django's connection from its pool and
  back included), each exchange a new conversation in a class (whose check is part of the
  batch); the process's CPU per exchange, every thread's.
* **The rows' making**: what ``exchange_rows`` costs per exchange on the thread that makes
  them, the event loop's in a worker (the rows' values, ids and timings included).
* **The inter-token histogram**: an answer's gaps (``--gaps``) observed in one update
  (``metrics.observe_all``) against one ``observe`` per gap, the CPU per answer, in one process
  and in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, as the production workers run).

    python benchmarks/answer_end.py [--batch 1 3 10] [--batches 1000] [--rounds 4]
                                    [--gaps 19 39 99] [--postgres URL] [--handed-over]

Medians of the rounds, the rounds' spread in brackets.
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.answer_path import POSTGRES  # noqa: E402


def spread(values: list[float], *, digits: int = 1) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


# --- the group writer ---------------------------------------------------------------------


def exchange_rows(new_id: Callable[[], uuid.UUID] | None = None) -> list:
    """What one exchange hands the group writer: its question, its answer, its record, under
    ids from ``new_id`` (the answer path's, ``ordered_uuid``, unless another is given)."""
    from assistant.ids import ordered_uuid
    from assistant.models import StreamRecord
    from assistant.services.conversations import Exchange, answer_rows, question_rows
    from assistant.services.persistence import Rows
    from assistant.services.telemetry import AnswerSummary, stream_record
    from assistant.services.timings import StreamTimings

    new_id = new_id or ordered_uuid
    exchange = Exchange(
        conversation_id=new_id(),
        user_message_id=new_id(),
        answer_message_id=new_id(),
        is_new_conversation=True,
        request_id=new_id().hex,
    )
    timings = StreamTimings(received=1.0, parsed=1.001, engine_submitted=1.002)
    timings.engine_first_delta = 1.05
    for token in range(20):
        timings.token_sent(1.051 + token * 0.01)
    timings.finished = 1.3
    summary = AnswerSummary(
        request_id=exchange.request_id,
        owner_key="session:benchmark",
        classroom_id=None,
        serving_path="direct",
        engine="scripted",
        outcome=StreamRecord.Outcome.OK,
        error_code="",
        conversation_id=exchange.conversation_id,
        message_id=exchange.answer_message_id,
        timings=timings,
    )
    question = question_rows(
        owner_key="session:benchmark",
        classroom_id=None,
        exchange=exchange,
        question="What is photosynthesis? 光合作用是什么？",
    )
    answer = answer_rows(
        exchange=exchange,
        content="Photosynthesis turns light into chemical energy. " * 4,
        outcome=StreamRecord.Outcome.OK,
        finish_reason="stop",
    )
    return [question, answer, Rows(records=[stream_record(summary)])]


def copy_tables(model: type, objs: list) -> None:
    """``insert_many`` as a ``COPY`` of the rows (psycopg formats them in C): tried, one table at
    a time, before the one statement."""
    from django.db import connections, router

    from assistant.services.table_rows import insert_columns, insert_values

    connection = connections[router.db_for_write(model)]
    fields = insert_columns(model, objs, connection)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(c.field.column) for c in fields)
    with connection.cursor() as cursor, connection.wrap_database_errors:
        table = quote(model._meta.db_table)
        with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in insert_values(fields, objs, connection):
                copy.write_row(row)


#: The ways a batch can be written: ``insert_many`` in place of the writer's, whether the
#: batch may be one statement (``batch_statement``), and the rows' ids (None: the answer
#: path's).
WAYS: dict[str, tuple[Callable | None, bool, Callable[[], uuid.UUID] | None]] = {
    "one statement": (None, True, None),
    "one statement, random ids": (None, True, uuid.uuid4),
    "insert per table": (None, False, None),
    "insert per table, random ids": (None, False, uuid.uuid4),
    "copy per table": (copy_tables, False, None),
}
#: SQLite's writer is its INSERT per table.
SQLITE_WAYS = ["insert per table", "insert per table, random ids"]


def server_cpu() -> float | None:
    """The CPU seconds the database server has spent on Django's connection: PostgreSQL's
    backend process's (``/proc``), None on SQLite (which runs in the writing thread)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_position() -> int | None:
    """Where PostgreSQL's write-ahead log is now (bytes from its start: every change of every
    row and index entry goes there first); None on SQLite."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        (position,) = cursor.fetchone()
    return int(position)


def writer_round(batch: int, batches: int, way: str) -> tuple[float, float | None, float | None]:
    """The writing thread's CPU per exchange (µs) over ``batches`` batches of ``batch``
    exchanges, written ``way``, the database server's (None: SQLite, in the thread's), and the
    bytes of write-ahead log per exchange (None: SQLite)."""
    from assistant.services import persistence, table_writes

    insert, one_statement, new_id = WAYS[way]
    made = [[rows for _ in range(batch) for rows in exchange_rows(new_id)] for _ in range(batches)]
    with contextlib.ExitStack() as undo:
        if insert is not None:
            undo.callback(setattr, table_writes, "insert_many", table_writes.insert_many)
            table_writes.insert_many = insert
        if not one_statement:
            undo.callback(setattr, persistence, "batch_statement", persistence.batch_statement)
            persistence.batch_statement = lambda tables, connection: None
        server, wal = server_cpu(), wal_position()
        cpu = time.thread_time()
        for rows in made:
            persistence.rows_write(rows)
        cpu = time.thread_time() - cpu
        exchanges = batch * batches
        if server is not None:
            server = (server_cpu() - server) / exchanges * 1e6  # type: ignore[operator]
        if wal is not None:
            wal = (wal_position() - wal) / exchanges  # type: ignore[operator]
    return cpu / exchanges * 1e6, server, wal


def handed_over_round(batch: int, batches: int, classroom_id: uuid.UUID) -> float:
    """The process's CPU (every thread's) per exchange over ``batches`` batches of ``batch``
    exchanges handed from an event loop to the database thread, one after the other, as the
    group writer hands them."""
    import asyncio

    from assistant.db import run_db_write
    from assistant.services import persistence

    made = [[rows for _ in range(batch) for rows in exchange_rows()] for _ in range(batches)]
    for rows in made:
        for conversation in (c for r in rows for c in r.conversations):
            conversation["classroom_id"] = classroom_id

    async def written() -> float:
        cpu = time.process_time()
        for rows in made:
            await run_db_write(persistence.rows_write, rows)
        return time.process_time() - cpu

    return asyncio.run(written()) / (batch * batches) * 1e6


def handed_over(args: argparse.Namespace) -> None:
    from assistant.models import Classroom

    classroom = Classroom.objects.create(name="benchmark", join_code="BENCH1")
    for batch in args.batch:
        handed_over_round(batch, 5, classroom.id)  # warm up: the thread's connection
        rounds = max(1, args.batches // batch)
        values = [handed_over_round(batch, rounds, classroom.id) for _ in range(args.rounds)]
        print(
            f"handed over to a thread: {spread(values)} us of CPU per exchange, batches of {batch}",
            flush=True,
        )


def rows_made(rounds: int, exchanges: int = 5000) -> str:
    """What making an exchange's rows (``exchange_rows``) costs the event loop, which makes
    them (µs of CPU per exchange, the rounds' median and spread)."""
    exchange_rows()  # warm up: imports
    figures = []
    for _ in range(rounds):
        cpu = time.thread_time()
        for _ in range(exchanges):
            exchange_rows()
        figures.append((time.thread_time() - cpu) / exchanges * 1e6)
    return spread(figures)


def writer(args: argparse.Namespace) -> None:
    """Set Django up on the database ``DATABASE_URL`` names (else a SQLite file), then time the
    writer each way, alternating."""
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    kind = connection.vendor
    if args.handed_over:
        handed_over(args)
        return
    print(f"rows made: {rows_made(args.rounds)} us of CPU per exchange", flush=True)
    ways = list(WAYS) if kind == "postgresql" else SQLITE_WAYS
    for batch in args.batch:
        for way in ways:
            writer_round(batch, 5, way)  # warm up: the connection
        figures: dict[str, list[float]] = {way: [] for way in ways}
        servers: dict[str, list[float]] = {way: [] for way in ways}
        logged: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way in ways:
                thread, server, wal = writer_round(batch, max(1, args.batches // batch), way)
                figures[way].append(thread)
                if server is not None:
                    servers[way].append(server)
                if wal is not None:
                    logged[way].append(wal)
        for way, values in figures.items():
            print(
                f"writer {kind} {way}: {spread(values)} us of CPU per exchange, batches of {batch}",
                flush=True,
            )
        for whose, found, unit, digits in (
            ("server", servers, "us of CPU", 1),
            ("wal", logged, "bytes", 0),
        ):
            for way, values in found.items():
                if values:
                    print(
                        f"{whose} {kind} {way}: {spread(values, digits=digits)} {unit} per "
                        f"exchange, batches of {batch}",
                        flush=True,
                    )
    connection.close()


# --- the inter-token histogram ------------------------------------------------------------


def histogram(args: argparse.Namespace) -> None:
    from prometheus_client import Histogram

    from assistant import metrics

    mode = "multiprocess" if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else "one process"
    child = Histogram("bench_gaps_seconds", "benchmark", ["path"], buckets=metrics.GAP_BUCKETS)
    answers = 2000
    for count in args.gaps:
        gaps = [0.008 + (i % 7) * 0.002 for i in range(count)]
        figures: dict[str, list[float]] = {"observe_all": [], "observe each": []}
        for _ in range(args.rounds):
            labelled = child.labels("direct")
            cpu = time.thread_time()
            for _ in range(answers):
                metrics.observe_all(labelled, gaps)
            figures["observe_all"].append((time.thread_time() - cpu) / answers * 1e6)
            cpu = time.thread_time()
            for _ in range(answers):
                for gap in gaps:
                    labelled.observe(gap)
            figures["observe each"].append((time.thread_time() - cpu) / answers * 1e6)
        for way, values in figures.items():
            print(
                f"histogram {mode} {way}: {spread(values)} us of CPU per answer of {count} gaps",
                flush=True,
            )


def part(name: str, args: argparse.Namespace, env: dict[str, str]) -> None:
    """Run one part in a process of its own (Django's settings and prometheus_client's value
    class are chosen once per process)."""
    command = [sys.executable, __file__, "--part", name, "--batch", *map(str, args.batch)]
    command += ["--batches", str(args.batches), "--rounds", str(args.rounds), "--gaps"]
    command += [str(g) for g in args.gaps]
    command += ["--handed-over"] if args.handed_over else []
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR", "CHATSITE_REDIS_URL")
    }
    environment = {
        **base,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "CHATSITE_ENGINE": "scripted",
        "CHATSITE_LOG_LEVEL": "WARNING",
        **env,
    }
    subprocess.run(command, cwd=ROOT, env=environment, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 3, 10], help="exchanges")
    parser.add_argument("--batches", type=int, default=1000, help="exchanges per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gaps", type=int, nargs="+", default=[19, 39, 99])
    parser.add_argument("--postgres", default=POSTGRES)
    parser.add_argument(
        "--handed-over",
        action="store_true",
        help="only the batch handed over to the writer's thread, in a class (PostgreSQL)",
    )
    parser.add_argument("--part", choices=["writer", "histogram"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "writer":
        writer(args)
        return
    if args.part == "histogram":
        histogram(args)
        return

    import psycopg

    name = f"answer_end_{uuid.uuid4().hex[:12]}"
    print(f"database: {name}", flush=True)
    with psycopg.connect(f"{args.postgres}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        part("writer", args, {"DATABASE_URL": f"{args.postgres}/{name}"})
    finally:
        with psycopg.connect(f"{args.postgres}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if args.handed_over:
        return
    with tempfile.TemporaryDirectory(prefix="answer-end-") as folder:
        part("writer", args, {"CHATSITE_SQLITE_PATH": str(Path(folder) / "writes.sqlite3")})
        part("histogram", args, {})
        metrics_dir = Path(folder) / "prometheus"
        metrics_dir.mkdir()
        part("histogram", args, {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})


if __name__ == "__main__":
    main()
