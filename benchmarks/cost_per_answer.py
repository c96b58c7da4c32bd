"""CPU per answer: chatsite against the server it runs on, running a raw ASGI app.

What chatsite's own work costs is the difference between chatsite on a server and the same
server running a raw ASGI application that writes the same frames
(assistant/benchmarking/raw_app.py): ``daphne-raw`` is chatsite's floor on Daphne,
``uvicorn-raw`` its floor under uvicorn[standard] (``chatsite-uvicorn``); ``uvicorn`` is the peer,
uvicorn[standard] + sse-starlette.

Every server runs at once, each one process on core 0, the load generator on core 1 (with two
or more cores). The servers are measured in turns: each round asks every server ``--requests``
questions, ``--concurrency`` at a time, a new connection each (as benchmarks/added_latency.py
does), and reads the server's CPU time from ``/proc`` around it; each round starts with the next
server in the list, so a machine whose speed drifts during the run shifts every server alike.
What a run prints is, per server, the median over the rounds of CPU per answer (with the
spread) and of the added first-token latency, and for chatsite on each server the median of
the rounds' ratios to its floor.

``--baseline DIR`` adds, for each chatsite server named (``chatsite``, ``chatsite-uvicorn``), the
same server with the code of another checkout (an earlier commit), ``chatsite-baseline`` and
``chatsite-uvicorn-baseline``, measured in the same rounds, so that a change's effect is read
against rounds that shared the machine's state with it (the median of the per-round ratios).

Figures at a concurrency of 1 are mostly what a core spends waking up for each event of one
stream (it sleeps between them), and they vary from run to run by half; at 50 the same work is
shared by the streams that wake together, and what is left is each answer's own.

    python benchmarks/cost_per_answer.py [--servers ...] [--concurrency 50] [--rounds 5]
                                         [--baseline DIR]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.added_latency import FLOORS, cpu_seconds, run_load  # noqa: E402
from benchmarks.capacity import CLIENT_CORE, SERVER_CORE, pin, start, uvicorn_kind  # noqa: E402
from benchmarks.load import raise_open_files  # noqa: E402

SERVERS = ["daphne-raw", "chatsite", "uvicorn-raw", "chatsite-uvicorn", "uvicorn"]
#: A chatsite server from the checkout ``--baseline`` names: ``chatsite-baseline``, ...
BASELINE = "-baseline"


def server_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME`` or ``NAME:VAR=VALUE,...``: a server, and the environment it runs with."""
    name, _, assignments = spec.partition(":")
    if name not in SERVERS:
        raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(SERVERS)}")
    env = {}
    for assignment in filter(None, assignments.split(",")):
        variable, equals, value = assignment.partition("=")
        if not equals or not variable:
            raise argparse.ArgumentTypeError(f"{assignment!r} is not VAR=VALUE")
        env[variable] = value
    return name, env


def floor_of(spec: str, name: str, measured: dict[str, list[float]]) -> str | None:
    """The floor measured beside chatsite server ``spec``: for a baseline, its server's raw one
    from the same checkout if there is one; its server's raw one with the same settings if
    there is one, else its server's raw one; None for a server without a floor."""
    if name not in FLOORS:
        return None
    settings = spec.partition(":")[2]
    floors = [f"{FLOORS[name]}:{settings}", FLOORS[name]]
    if spec.endswith(BASELINE):
        floors.insert(0, FLOORS[name] + BASELINE)
    for floor in floors:
        if floor in measured:
            return floor
    return None


def baselines(servers: list[str]) -> dict[str, tuple[str, dict[str, str]]]:
    """For each chatsite server named plainly in ``servers``, the same server run from the
    ``--baseline`` checkout: ``NAME-baseline``; and so for ``daphne-raw``, which is Daphne as
    that checkout runs it (``chatsite/server.py``), the floor its ``chatsite-baseline`` is
    measured against. (``uvicorn-raw`` runs no chatsite code: one floor serves both.)"""
    from_checkout = [*FLOORS, FLOORS["chatsite"]]
    return {name + BASELINE: (name, {}) for name in servers if name in from_checkout}


def one_round(port: int, pid: int, request: bytes, args: argparse.Namespace) -> tuple[float, float]:
    """CPU ms per answer of server ``pid`` over ``--requests`` answers, and their P50 added TTFT."""
    before = cpu_seconds(pid)
    samples = asyncio.run(run_load(port, request, args.requests, args.concurrency))
    spent = cpu_seconds(pid) - before
    added = statistics.median(samples) * 1000 - args.ttft_ms
    return spent * 1000 / len(samples), added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--servers",
        nargs="+",
        default=SERVERS,
        help=f"of {', '.join(SERVERS)}, each as NAME or NAME:VAR=VALUE,... to run it with "
        "settings of its own (chatsite:CHATSITE_EVENT_LOOP=asyncio beside chatsite compares two "
        "event loops in one run)",
    )
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--requests", type=int, default=600, help="per server and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ttft-ms", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--itl-ms", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also measure each chatsite server named, and daphne-raw, with this checkout's "
        "code, as chatsite-baseline, chatsite-uvicorn-baseline and daphne-raw-baseline",
    )
    args = parser.parse_args()
    try:
        specs = {spec: server_spec(spec) for spec in args.servers}
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if len(specs) < len(args.servers):
        parser.error("a server is named twice in --servers")
    if args.baseline is not None:
        if not (args.baseline / "manage.py").is_file():
            parser.error(f"--baseline {args.baseline} is not a checkout of chatsite")
        added = baselines(args.servers)
        specs.update(added)
        args.servers = [*args.servers, *added]

    raise_open_files()
    pinned = len(os.sched_getaffinity(0)) >= 2
    if pinned:
        os.sched_setaffinity(0, CLIENT_CORE)
    print("servers on core 0, load generator on core 1" if pinned else "all on the same cores")
    print(f"uvicorn: {uvicorn_kind()}")
    print(
        f"{args.rounds} rounds of {args.requests} answers per server, {args.concurrency} at a "
        f"time: {args.ttft_ms} ms to the first token, then {args.tokens} tokens "
        f"{args.itl_ms} ms apart\n",
        flush=True,
    )
    cpu: dict[str, list[float]] = {name: [] for name in args.servers}
    added: dict[str, list[float]] = {name: [] for name in args.servers}
    with tempfile.TemporaryDirectory() as folder:
        started = {}
        try:
            for spec, (name, env) in specs.items():
                root = args.baseline if spec.endswith(BASELINE) else ROOT
                started[spec] = start(name, args, Path(folder), env, root=root)
            for port, pid, request, _, _ in started.values():
                if pinned:
                    pin(pid, SERVER_CORE)
                asyncio.run(run_load(port, request, 20, 5))  # warm up
            for turn in range(args.rounds):
                order = (
                    args.servers[turn % len(args.servers) :]
                    + args.servers[: turn % len(args.servers)]
                )
                for name in order:
                    port, pid, request, _, _ = started[name]
                    spent, late = one_round(port, pid, request, args)
                    cpu[name].append(spent)
                    added[name].append(late)
                print(
                    f"round {turn + 1}: "
                    + "  ".join(f"{name} {cpu[name][-1]:.2f}" for name in args.servers)
                    + " ms/answer",
                    flush=True,
                )
        finally:
            for _, _, _, server, process in started.values():
                if server is not None:
                    server.stop()
                if process is not None:
                    process.terminate()
                    process.wait()
    print("\n| server | CPU per answer, median (min-max) | added TTFT P50, median |")
    print("| --- | --- | --- |")
    for name in args.servers:
        print(
            f"| {name} | {statistics.median(cpu[name]):.2f} ms ({min(cpu[name]):.2f}-"
            f"{max(cpu[name]):.2f}) | {statistics.median(added[name]):.1f} ms |"
        )
    ratios = {}
    for spec, (name, _) in specs.items():
        floor = floor_of(spec, name, cpu)
        if floor is None:
            continue
        each = [spent / base for spent, base in zip(cpu[spec], cpu[floor], strict=True)]
        ratios[spec] = each
        print(
            f"\n{spec} against {floor}: {statistics.median(each):.2f}x "
            f"(rounds {min(each):.2f}-{max(each):.2f}x)",
            end="",
        )
    for name in [spec for spec in args.servers if spec + BASELINE in cpu]:
        old = cpu[name + BASELINE]
        each = [new / base for new, base in zip(cpu[name], old, strict=True)]
        ratios[f"{name}/baseline"] = each
        print(
            f"\n{name} against {name}{BASELINE}: {statistics.median(each):.2f}x "
            f"(rounds {min(each):.2f}-{max(each):.2f}x)",
            end="",
        )
    print(flush=True)
    if args.json:
        rows = {"cpu_ms": cpu, "added_ttft_ms": added, "ratios": ratios, "args": vars(args)}
        args.json.write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
