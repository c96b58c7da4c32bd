"""Capacity: the most students one server process keeps streaming at 20 tokens a second each
with a P99 added inter-token latency of at most 50 ms and no failed answer.

The servers, one at a time, each on loopback (as in benchmarks/added_latency.py):

* ``bare``: a minimal asyncio server writing the same frames (the floor);
* ``uvicorn``: uvicorn + sse-starlette, with uvloop and httptools when installed
  (``uvicorn[standard]``, as FastAPI is usually deployed: ``pip install -e ".[bench]"``);
* ``chatsite``: one Daphne worker with chatsite's ``direct`` path on the scripted engine, with
  the production settings except the limits meant for one client (one session asks every
  question here): no cap on streams per session, per address or per worker;
* ``chatsite-uvicorn``: the same application under uvicorn[standard] instead of Daphne
  (``python -m chatsite.uvicorn_server``, its production worker).

``--through nginx`` measures the production profile instead (benchmarks/capacity_nginx.py):
chatsite's loopback stack (the shipped nginx site, ``--workers`` workers, PostgreSQL and Redis,
a session per student, a class of 60 per loopback address) and the peer behind an nginx that
does what chatsite's stream location does; the CPU counted is the box's (nginx, the server,
and PostgreSQL and Redis where chatsite uses them).

Every student asks in a closed loop, a new connection per question; the engine takes
``--ttft-ms`` to the first token, then writes ``--tokens`` tokens ``--itl-ms`` apart. For each
server the number of students doubles from ``--start`` until a level fails, then the interval is
halved until it is within ``--resolution`` of the largest pass (assistant/benchmarking/capacity.py).

With two or more cores the server (and nginx) runs on core 0 and the load generator on core 1,
so neither takes CPU from the other; both CPU figures are printed (a share of one core).

    python benchmarks/capacity.py [--servers bare uvicorn chatsite] [--start 50] [--most 3200]
                                  [--through nginx] [--workers 1] [--follow-ups 0]

``--follow-ups N``: each student asks N more questions in the conversation their first began
(its history read with each), then begins another; a server that names no conversation (the
peer) is asked new questions only.

A server named more than once in ``--servers`` is started afresh and measured again in each of
its turns (``--servers chatsite-uvicorn uvicorn chatsite-uvicorn uvicorn``: in alternation, so
that a machine whose speed drifts shifts both alike). The run ends with the standing: each
server's CPU per answer (its process, then all of the box's), the median of its turns at each
number of students, and its ratio to the peer's and to the bare server's. ``--chatsite-env
NAME=VALUE`` gives chatsite's workers a setting (``CHATSITE_LOG_LEVEL=WARNING``, ...), to
measure what one costs.

``--profile DIR`` samples the server during each level with py-spy, or with Linux's perf
(``--profiler perf``: every thread, only while on a CPU; as in benchmarks/added_latency.py; the
sampler runs on the load generator's core) and prints the top of each profile (through nginx,
the first worker). The sampling costs CPU: take the capacities from runs without it.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assistant.benchmarking.capacity import (  # noqa: E402
    TTFT_LIMIT_MS,
    Level,
    crowd,
    level_figures,
    next_level,
    standing_rows,
)
from assistant.benchmarking.sampling import (  # noqa: E402
    PERF_ENV,
    PROFILERS,
    sampler_show,
    sampler_start,
)
from assistant.benchmarking.servers import BENCHMARK_ENV, LiveServer, start_daphne  # noqa: E402
from benchmarks.added_latency import (  # noqa: E402
    build_request,
    cpu_seconds,
    database_migrate,
    page_request,
    peer_start,
)
from benchmarks.capacity_nginx import Box, BoxClock, box_start, pin_box  # noqa: E402
from benchmarks.load import class_address, raise_open_files  # noqa: E402

SERVER_CORE, CLIENT_CORE = {0}, {1}


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` (and so those it starts later) onto ``cores``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


def uvicorn_kind() -> str:
    try:
        import httptools  # noqa: F401
        import uvloop  # noqa: F401
    except ImportError:
        return "uvicorn (h11, asyncio loop)"
    return "uvicorn[standard] (httptools, uvloop)"


def start(
    name: str,
    args: argparse.Namespace,
    tmp: Path,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
) -> tuple[int, int, bytes, LiveServer | None, subprocess.Popen[bytes] | None]:
    """Start server ``name`` (with ``env`` added to its environment; a chatsite server with the
    code of checkout ``root``): its port, its pid, the question's request, and what to stop."""
    if not name.startswith("chatsite"):
        process, port = peer_start(name, args.ttft_ms, args.tokens, args.itl_ms, env, root=root)
        request = build_request(port, b'{"message": "What is photosynthesis?"}')
        return port, process.pid, request, None, process
    own_env = env or {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    db = tmp / f"{name}-{len(list(tmp.glob('*.sqlite3')))}.sqlite3"  # several may run at once
    database_migrate(root, env, db)
    server = start_daphne(
        workdir=tmp,
        root=root,
        db_path=str(db),
        env={
            **BENCHMARK_ENV,
            "CHATSITE_SCRIPTED_TTFT_MS": str(args.ttft_ms),
            "CHATSITE_SCRIPTED_TOKENS": str(args.tokens),
            "CHATSITE_SCRIPTED_ITL_MS": str(args.itl_ms),
            "CHATSITE_MAX_STREAMS": "0",
            "CHATSITE_STREAMS_PER_ADDRESS": "0",
            **own_env,
        },
        uvicorn=name == "chatsite-uvicorn",
    )
    port, request = page_request("chatsite", server, root, env, db)
    return port, server.process.pid, request, server, None


class PidClock:
    """The CPU seconds of process ``pid`` (its threads included) since ``start``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.began = pid, 0.0

    def start(self) -> None:
        self.began = cpu_seconds(self.pid)

    def stop(self) -> float:
        return cpu_seconds(self.pid) - self.began


def measure(
    port: int,
    requests: bytes | list[bytes],
    students: int,
    *,
    args: argparse.Namespace,
    clock: PidClock | BoxClock,
    source: Callable[[int], str] | None = None,
) -> Level:
    """One level: ``students`` asking ``port`` in a closed loop, and the server's CPU over it
    as ``clock`` reads it."""
    wall = time.perf_counter()
    clock.start()
    answers, client_cpu_s = asyncio.run(
        crowd(
            port,
            requests,
            students,
            warmup_s=args.warmup_s,
            measure_s=args.measure_s,
            source=source,
            follow_ups=args.follow_ups,
        )
    )
    server_cpu_s = clock.stop()
    return level_figures(
        students,
        answers,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        measure_s=args.measure_s,
        server_cpu_s=server_cpu_s,
        client_cpu_s=client_cpu_s,
        wall_s=time.perf_counter() - wall,
        cpu_by_role=clock.spent if isinstance(clock, BoxClock) else None,
    )


def measure_direct(
    name: str, port: int, pid: int, request: bytes, students: int, *, args: argparse.Namespace
) -> Level:
    sampler = sampler_start(args.profile, pid, f"{name}-{students}", args.profiler)
    level = measure(port, request, students, args=args, clock=PidClock(pid))
    sampler_show(sampler)
    return level


def show(name: str, level: Level, args: argparse.Namespace) -> None:
    verdict = "pass" if level.passes(args.itl_limit_ms, args.ttft_limit_ms) else "FAIL"
    print(
        f"{name:8s} {level.students:5d} students  {level.answers:5d} answers"
        f" {level.errors:4d} failed  {level.tokens_per_s:8.0f} tokens/s"
        f"  added TTFT p50/p99 {level.added_ttft_p50}/{level.added_ttft_p99} ms"
        + (
            f" (follow-ups {level.follow_up_ttft_p50}/{level.follow_up_ttft_p99} ms)"
            if level.follow_up_ttft_p50 is not None
            else ""
        )
        + f"  added ITL p50/p99/max {level.added_itl_p50}/{level.added_itl_p99}"
        f"/{level.added_itl_max} ms  end p99 {level.added_end_p99} ms"
        f"  CPU server {level.server_cpu:.0%} client {level.client_cpu:.0%}  {verdict}"
        + (f"  ({level.first_error})" if level.first_error else ""),
        flush=True,
    )


def env_setting(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as a pair."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=["bare", "uvicorn", "chatsite", "chatsite-uvicorn"],
        default=["bare", "uvicorn", "chatsite"],
        help="measured in this order; a server named again is started and measured again",
    )
    parser.add_argument("--start", type=int, default=50, help="students at the first level")
    parser.add_argument("--most", type=int, default=3200, help="students at most")
    parser.add_argument("--resolution", type=float, default=0.1, help="of the largest pass")
    parser.add_argument("--itl-limit-ms", type=float, default=50, help="P99 added ITL")
    parser.add_argument("--ttft-limit-ms", type=float, default=TTFT_LIMIT_MS, help="P99 added TTFT")
    parser.add_argument("--ttft-ms", type=int, default=100)
    parser.add_argument("--itl-ms", type=int, default=50, help="50 ms: 20 tokens a second")
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--warmup-s", type=float, default=3)
    parser.add_argument("--measure-s", type=float, default=10)
    parser.add_argument(
        "--through",
        choices=["direct", "nginx"],
        default="direct",
        help="nginx: the production profile (benchmarks/capacity_nginx.py)",
    )
    parser.add_argument("--workers", type=int, default=1, help="chatsite's, behind nginx")
    parser.add_argument(
        "--follow-ups",
        type=int,
        default=0,
        help="questions each student asks in the conversation they began, then starts another",
    )
    parser.add_argument(
        "--chatsite-env",
        type=env_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for chatsite's workers (CHATSITE_LOG_LEVEL=WARNING, ...), repeatable",
    )
    parser.add_argument("--json", type=Path, help="write every level's figures here")
    parser.add_argument("--profile", type=Path, help="sample the server at each level, into DIR")
    parser.add_argument("--profiler", choices=PROFILERS, default="py-spy")
    args = parser.parse_args()
    if args.profile and args.profiler == "perf":
        os.environ.update(PERF_ENV)  # the servers' (set before any starts)

    raise_open_files()
    pinned = len(os.sched_getaffinity(0)) >= 2
    if pinned:
        os.sched_setaffinity(0, CLIENT_CORE)
    box = "nginx and the server" if args.through == "nginx" else "server"
    print(
        f"{box} on core 0, load generator on core 1"
        if pinned
        else f"{box} and load generator share the cores"
    )
    print(f"uvicorn: {uvicorn_kind()}\n", flush=True)
    results: dict[str, list[dict]] = {}
    turns: list[tuple[str, Level]] = []
    with tempfile.TemporaryDirectory() as folder:
        for turn, name in enumerate(args.servers):
            # A server named again (turns in alternation) is started afresh, in a folder of its
            # own; its levels are kept beside the first turn's.
            work = Path(folder) / str(turn)
            work.mkdir()
            key = name if name not in results else f"{name} (turn {turn + 1})"
            if args.through == "nginx":
                with box_start(name, args, work) as nginx_box:
                    if pinned:
                        pin_box(nginx_box, SERVER_CORE)
                    results[key] = search(name, args, partial(measure_box, nginx_box, args), turns)
                continue
            own = dict(args.chatsite_env) if name.startswith("chatsite") else None
            port, pid, request, server, process = start(name, args, work, own)
            if pinned:
                pin(pid, SERVER_CORE)
            try:
                asyncio.run(crowd(port, request, 5, warmup_s=0, measure_s=1))  # warm up
                one = partial(measure_direct, name, port, pid, request, args=args)
                results[key] = search(name, args, one, turns)
            finally:
                if server is not None:
                    server.stop()
                if process is not None:
                    process.terminate()
                    process.wait()
    print("\n".join(standing_rows(turns)), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def search(
    name: str,
    args: argparse.Namespace,
    one: Callable[[int], Level],
    turns: list[tuple[str, Level]],
) -> list[dict]:
    """The levels tried for server ``name`` (``one`` measures a level), until its capacity is
    found; prints each, then the capacity. Each level is added to ``turns``."""
    passed: list[int] = []
    failed: list[int] = []
    levels = []
    while (
        students := next_level(
            passed, failed, start=args.start, most=args.most, resolution=args.resolution
        )
    ) is not None:
        level = one(students)
        show(name, level, args)
        turns.append((name, level))
        passes = level.passes(args.itl_limit_ms, args.ttft_limit_ms)
        (passed if passes else failed).append(students)
        levels.append(asdict(level))
    print(f"{name}: {max(passed, default=0)} students\n", flush=True)
    return levels


def measure_box(box: Box, args: argparse.Namespace, students: int) -> Level:
    """One level through nginx: every student their own request (a session each, for
    chatsite), a class of them per loopback address; the CPU of nginx, the server and the
    services it uses (``capacity_nginx.BOX_ROLES``)."""
    requests = box.requests_for(students) if box.ask else box.requests
    if not box.warm:
        asyncio.run(crowd(box.port, requests[:5], 5, warmup_s=0, measure_s=1, source=class_address))
        box.warm = True
    clock = BoxClock(box)
    worker = min(pid for pid, role in box.roles.items() if role == "server")
    sampler = sampler_start(args.profile, worker, f"{box.name}-{students}", args.profiler)
    level = measure(box.port, requests, students, args=args, clock=clock, source=class_address)
    sampler_show(sampler)
    spent = ", ".join(f"{role} {seconds:.1f}" for role, seconds in clock.spent.items())
    print(f"  box CPU s, the level below: {spent}", flush=True)
    return level


if __name__ == "__main__":
    main()
