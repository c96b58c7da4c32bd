"""The CPU-per-answer benchmark's parts (benchmarks/cost_per_answer.py): the raw floor each
server is measured against writes what a chatsite answer writes, run by the real servers, and
the benchmark's server specifications. The costs themselves are measured by the benchmark."""

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from assistant.benchmarking.frames import SSEParser
from benchmarks.added_latency import body_pieces, build_request, one_request, peer_start
from benchmarks.answer_path import POSTGRES
from benchmarks.cost_per_answer import baselines, floor_of, server_spec
from tests.support import REDIS_URL, ChatClient

ROOT = Path(__file__).resolve().parents[2]


def raw_events(port: int) -> list[tuple[str, str]]:
    """The events of one answer from the raw server on ``port``, read whole."""

    async def read() -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(build_request(port, b'{"message": "Hi"}'))
        head = await reader.readuntil(b"\r\n\r\n")
        body = b"".join([piece async for piece in body_pieces(reader, head)])  # de-chunked
        writer.close()
        return head, body

    head, body = asyncio.run(read())
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"content-type: text/event-stream" in head.lower()
    return [(e.event, e.data) for e in SSEParser().feed(body)]


@pytest.mark.parametrize("server", ["daphne-raw", "uvicorn-raw"])
def test_the_raw_floor_writes_the_frames_of_an_answer(server: str, chat_client: ChatClient) -> None:
    process, port = peer_start(server, ttft_ms=20, tokens=3, itl_ms=1)
    try:
        raw = raw_events(port)
        # The first token after the engine's delay (a timer may fire a millisecond early).
        assert asyncio.run(one_request(port, build_request(port, b'{"message": "x"}'))) > 0.015
    finally:
        process.terminate()
        process.wait()
    site = [(e.event, e.data) for e in chat_client.ask("Hi")]
    kinds = [event for event, _ in raw]
    assert kinds == ["meta", "token", "token", "token", "done"]
    # The same events as chatsite's, with the same fields in each.
    assert set(json.loads(raw[0][1])) == set(json.loads(site[0][1]))
    assert [json.loads(data)["text"] for _, data in raw[1:4]] == [" t1", " t2", " t3"]
    assert {"finish_reason", "tokens", "timings"} <= set(json.loads(raw[-1][1]))


def test_a_server_spec_names_a_server_and_its_settings() -> None:
    assert server_spec("chatsite") == ("chatsite", {})
    assert server_spec("chatsite:CHATSITE_EVENT_LOOP=asyncio,CHATSITE_GC_THRESHOLD=0") == (
        "chatsite",
        {"CHATSITE_EVENT_LOOP": "asyncio", "CHATSITE_GC_THRESHOLD": "0"},
    )
    with pytest.raises(argparse.ArgumentTypeError, match="not one of"):
        server_spec("gunicorn")
    with pytest.raises(argparse.ArgumentTypeError, match="not VAR=VALUE"):
        server_spec("chatsite:CHATSITE_EVENT_LOOP")


def test_each_chatsite_server_is_measured_against_its_own_floor() -> None:
    measured = {
        "daphne-raw": [1.0],
        "daphne-raw:CHATSITE_EVENT_LOOP=asyncio": [1.0],
        "uvicorn-raw": [1.0],
    }
    assert floor_of("chatsite", "chatsite", measured) == "daphne-raw"
    spec = "chatsite:CHATSITE_EVENT_LOOP=asyncio"
    assert floor_of(spec, "chatsite", measured) == "daphne-raw:CHATSITE_EVENT_LOOP=asyncio"
    assert floor_of("chatsite:CHATSITE_GC_THRESHOLD=0", "chatsite", measured) == "daphne-raw"
    assert floor_of("chatsite-uvicorn", "chatsite-uvicorn", measured) == "uvicorn-raw"
    assert floor_of("uvicorn", "uvicorn", measured) is None
    assert floor_of("chatsite-uvicorn", "chatsite-uvicorn", {}) is None


def test_a_baseline_checkout_runs_each_chatsite_server_against_its_own_daphne() -> None:
    named = ["daphne-raw", "chatsite", "uvicorn-raw", "chatsite-uvicorn", "uvicorn"]
    assert baselines(named) == {
        "daphne-raw-baseline": ("daphne-raw", {}),
        "chatsite-baseline": ("chatsite", {}),
        "chatsite-uvicorn-baseline": ("chatsite-uvicorn", {}),
    }
    assert baselines(["chatsite:CHATSITE_EVENT_LOOP=asyncio", "uvicorn"]) == {}
    measured = {"daphne-raw": [1.0], "uvicorn-raw": [1.0]}
    assert floor_of("chatsite-baseline", "chatsite", measured) == "daphne-raw"
    assert floor_of("chatsite-uvicorn-baseline", "chatsite-uvicorn", measured) == "uvicorn-raw"
    measured["daphne-raw-baseline"] = [1.0]
    assert floor_of("chatsite-baseline", "chatsite", measured) == "daphne-raw-baseline"
    assert floor_of("chatsite", "chatsite", measured) == "daphne-raw"


def benchmark_run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """A benchmark run to its end (it must succeed), with what it printed."""
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env={**os.environ, "CHATSITE_LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.parametrize(
    ("stores", "hiredis"), [("local", True), ("production", True), ("production", False)]
)
def test_the_answer_path_benchmark_answers_in_process(stores: str, hiredis: bool) -> None:
    """benchmarks/answer_path.py calls the application as a server would and reports the CPU of
    whole answers (each with its tokens), on SQLite and memory or on the production profile's
    PostgreSQL and Redis (the machine's, in a database and under a prefix of the run's own),
    with redis-py's replies read by hiredis or, with ``--without-hiredis``, by its own parser."""
    command = ["benchmarks/answer_path.py", "--answers", "20", "--rounds", "1", "--stores", stores]
    command += [] if hiredis else ["--without-hiredis"]
    done = benchmark_run(command)
    assert f"redis-py's parser: {'hiredis' if hiredis else 'Python'}\n" in done.stdout
    [line] = [line for line in done.stdout.splitlines() if line.startswith("round 1:")]
    assert "20 answers (20 tokens each), 1 at a time:" in line
    assert float(line.split(": ")[2].split(" ms")[0]) > 0
    writer = line.split("the group writer ")[1].split()
    assert int(writer[0]) >= 1 and writer[1] == "batches," and float(writer[2]) > 0
    if stores == "production":  # what the run made is gone
        lines = done.stdout.splitlines()
        [name] = [line.split()[1] for line in lines if line.startswith("stores:")]
        with psycopg.connect(f"{POSTGRES}/postgres") as admin:
            found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            assert found.fetchall() == []
        assert list(redis.Redis.from_url(REDIS_URL).scan_iter(match=f"{name}:*")) == []


def test_the_answer_end_benchmark_prints_each_way_and_drops_its_database() -> None:
    """benchmarks/answer_end.py: the group writer each way on PostgreSQL (with the server's own
    CPU and the write-ahead log it wrote) and on SQLite, under ordered and random ids, and the
    inter-token histogram both ways in one process and in multiprocess mode."""
    command = ["benchmarks/answer_end.py", "--batch", "2", "--batches", "4", "--rounds", "1"]
    command += ["--gaps", "5"]
    done = subprocess.run(
        [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = {
        line.split(":")[0]: float(line.split(": ")[1].split()[0])
        for line in done.stdout.splitlines()
        if line.startswith(("writer", "server", "wal", "histogram"))
    }
    ways = ("one statement", "insert per table", "copy per table")
    ways += ("one statement, random ids", "insert per table, random ids")
    sqlite = ("insert per table", "insert per table, random ids")
    assert set(figures) == {
        f"{whose} postgresql {way}" for whose in ("writer", "server", "wal") for way in ways
    } | {f"writer sqlite {way}" for way in sqlite} | {
        f"histogram {mode} {way}"
        for mode in ("one process", "multiprocess")
        for way in ("observe_all", "observe each")
    }
    # PostgreSQL's own CPU is read in clock ticks: a few exchanges may take none.
    assert all(value > 0 for name, value in figures.items() if not name.startswith("server"))
    assert all(value >= 0 for value in figures.values())
    [name] = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("database:")]
    with psycopg.connect(f"{POSTGRES}/postgres") as admin:
        found = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        assert found.fetchall() == []


def test_the_admission_benchmark_prints_both_ways() -> None:
    """benchmarks/admission.py admits new questions on the event loop and on a reader thread,
    on the local profile whatever this run's, and prints the CPU of each way."""
    command = ["benchmarks/admission.py", "--admissions", "40", "--rounds", "1"]
    command += ["--at-once", "1", "4"]
    done = benchmark_run(command)
    rows = [line.split() for line in done.stdout.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[1]) for row in rows] == [
        ("1", "loop"),
        ("1", "thread"),
        ("4", "loop"),
        ("4", "thread"),
    ]
    assert all(float(row[2]) > 0 for row in rows), done.stdout
    assert all(row[4] == "|" and float(row[5]) > 0 for row in rows), done.stdout  # its time
