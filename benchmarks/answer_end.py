"""What an ended answer costs the worker: the group writer's batch and the gaps' histogram.

Two pieces of every answer's end, each beside the way it was done before:

* **The group writer** (``persistence.rows_write``): batches of ``--batch`` exchanges, each a
  new conversation, its question, its answer, the conversation's touch and the stream record,
  as the answer path submits them (three ``Rows`` per exchange). The writing thread's CPU per
  exchange, on PostgreSQL (a database made for the run, dropped after) and on SQLite:
  ``copy`` is the writer as it is (one ``COPY`` per table on PostgreSQL), ``insert`` the same
  writer with ``insert_many`` done as before, one ``executemany`` INSERT with Django's
  client-side binding (on SQLite both are the INSERT). Rounds alternate between the two.
* **The inter-token histogram**: an answer's gaps (``--gaps``) observed in one update
  (``metrics.observe_all``) against one ``observe`` per gap, the CPU per answer, in one process
  and in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, as the production workers run).

    python benchmarks/answer_end.py [--batch 10] [--batches 200] [--rounds 4]
                                    [--gaps 19 39 99] [--postgres URL]

Medians of the rounds, the rounds' spread in brackets.
"""

import argparse
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


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


# --- the group writer ---------------------------------------------------------------------


def exchange_rows() -> list:
    """What one exchange hands the group writer: its question, its answer, its record."""
    from assistant.models import StreamRecord
    from assistant.services.conversations import Exchange, answer_rows, question_rows
    from assistant.services.persistence import Rows
    from assistant.services.telemetry import AnswerSummary, stream_record
    from assistant.services.timings import StreamTimings

    exchange = Exchange(
        conversation_id=uuid.uuid4(),
        user_message_id=uuid.uuid4(),
        answer_message_id=uuid.uuid4(),
        is_new_conversation=True,
        request_id=uuid.uuid4().hex,
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


def insert_statement(model: type, objs: list) -> None:
    """``insert_many`` as it was: one ``executemany`` INSERT (Django binds on the client)."""
    from django.db import connections, router

    connection = connections[router.db_for_write(model)]
    auto = model._meta.auto_field
    fields = [
        f
        for f in model._meta.concrete_fields
        if not f.generated and not (f is auto and all(obj.pk is None for obj in objs))
    ]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES ({placeholders})"
    params = [
        [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields] for obj in objs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def writer_round(batch: int, batches: int, insert: Callable | None) -> float:
    """The writing thread's CPU per exchange (µs) over ``batches`` batches; ``insert`` in place
    of ``insert_many`` when given."""
    from assistant.services import persistence

    made = [[rows for _ in range(batch) for rows in exchange_rows()] for _ in range(batches)]
    kept = persistence.insert_many
    if insert is not None:
        persistence.insert_many = insert
    try:
        cpu = time.thread_time()
        for rows in made:
            persistence.rows_write(rows)
        cpu = time.thread_time() - cpu
    finally:
        persistence.insert_many = kept
    return cpu / (batch * batches) * 1e6


def writer(args: argparse.Namespace) -> None:
    """Set Django up on the database ``DATABASE_URL`` names (else a SQLite file), then time the
    writer both ways, alternating."""
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    call_command("migrate", verbosity=0)
    writer_round(args.batch, 5, None)  # warm up: connection, statements
    ways = {"copy": None, "insert": insert_statement}
    figures: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, insert in ways.items():
            figures[way].append(writer_round(args.batch, args.batches, insert))
    kind = connection.vendor
    for way, values in figures.items():
        same = " (the same INSERT)" if kind != "postgresql" else ""
        print(
            f"writer {kind} {way}: {spread(values)} us of CPU per exchange, "
            f"batches of {args.batch}{same}",
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
    command = [sys.executable, __file__, "--part", name, "--batch", str(args.batch)]
    command += ["--batches", str(args.batches), "--rounds", str(args.rounds), "--gaps"]
    command += [str(g) for g in args.gaps]
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
    parser.add_argument("--batch", type=int, default=10, help="exchanges per batch")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gaps", type=int, nargs="+", default=[19, 39, 99])
    parser.add_argument("--postgres", default=POSTGRES)
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
    with tempfile.TemporaryDirectory(prefix="answer-end-") as folder:
        part("writer", args, {"CHATSITE_SQLITE_PATH": str(Path(folder) / "writes.sqlite3")})
        part("histogram", args, {})
        metrics_dir = Path(folder) / "prometheus"
        metrics_dir.mkdir()
        part("histogram", args, {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})


if __name__ == "__main__":
    main()
