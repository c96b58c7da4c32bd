"""Load: many students at once, through the production profile and on the embedded model.

Two scenarios, each on loopback, bounded in requests and in time:

* ``production``: deploy/loopback_stack brings up nginx, ``--workers`` workers (Daphne, or
  uvicorn with ``--server uvicorn``; ``--server both``: half each, in the two pools of
  deploy/nginx/chatsite-servers.conf), PostgreSQL and Redis, the workers on the scripted engine
  (``--ttft-ms`` to the first token, then ``--tokens`` tokens ``--itl-ms`` apart: 20 tokens/s by
  default). For each ``--streams`` level, that many students (each its own cookies and session)
  ask in a closed loop until ``--rounds`` times that many questions have been asked, or
  ``--cap-s`` has passed. Then the largest level runs against one worker with no nginx in front
  (``--setups direct``). The workers' limits are set so that none refuses the load by design
  (MAX_STREAMS = the largest level, whichever worker gets it); per-session limits keep their
  defaults. Students load the page 50 at a time before asking; a burst of as many first visits
  as students is measured on its own before each level.
* ``embedded``: one Daphne worker on the llama.cpp engine (SmolLM2 on the CPU, answers of
  ``--max-tokens``), ``--students`` students asking once each, all at once. The engine decodes
  one answer at a time; the others wait in line, told their place by ``event: queue``.

    python benchmarks/load.py production [--streams 100 500 1000] [--workers 2] [--setups ...]
    python benchmarks/load.py embedded [--students 100] [--max-tokens 32]

Both print Markdown tables: latency as the client saw it, CPU seconds by process over the
measured run (from /proc), and what nginx and the workers logged as warnings or errors;
``--json FILE`` writes them with each run's summary. Before each run the script waits while
benchmarks/added_latency.py runs (both would share the same cores and spoil each other's
figures), then for up to ``--idle-wait-s`` while other work keeps the machine busy.
"""

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assistant.benchmarking import (  # noqa: E402
    BenchmarkError,
    LoadPlan,
    RunResult,
    Sample,
    SSEParser,
    percentile,
    run_benchmark,
    summarize,
)
from assistant.benchmarking.client import Student  # noqa: E402
from assistant.benchmarking.servers import start_daphne  # noqa: E402
from deploy.loopback_stack import (  # noqa: E402
    WORKER_CONNECTIONS,
    LoopbackStack,
    add_server_option,
)

TICK = os.sysconf("SC_CLK_TCK")
#: Students who share one address, as a class behind its school's NAT.
STUDENTS_PER_ADDRESS = 60


#: The students here ask again the moment an answer ends, far faster than a class does: nginx's
#: per-address request rates (4 and 5 a second) would refuse most of it. They are raised for the
#: run; the bursts and the open-streams limit stay as shipped.
CROWD_RATES = (
    ("snippets/chatsite-http.conf", "rate=4r/s;", "rate=10000r/s;"),
    ("snippets/chatsite-http.conf", "rate=5r/s;", "rate=10000r/s;"),
)


def class_address(student: int) -> str:
    """The loopback address student number ``student`` connects from: one per class."""
    return f"127.0.1.{1 + student // STUDENTS_PER_ADDRESS}"


QUESTIONS = [
    "What is photosynthesis?",
    "Why is the sky blue?",
    "How do vaccines work?",
    "What causes the seasons?",
    "Explain gravity to a child.",
    "What is a prime number?",
    "How does a rainbow form?",
    "Why do we have tides?",
    "What is an atom made of?",
    "How do bees make honey?",
]


# --- what the client sees ----------------------------------------------------------------------


@dataclass
class Collector:
    """Samples as they end (so a run cut off by the time cap keeps them), the moment the
    measured run began, and the ``event: queue`` frames each answer carried."""

    on_start: Callable[[], None] = lambda: None
    samples: list[Sample] = field(default_factory=list)
    queue: dict[int, dict[str, float]] = field(default_factory=dict)
    #: Page loads at once: a burst of first visits is measured on its own (``page_burst``).
    pages: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(50))
    page_retries: int = 0
    began: float | None = None
    students: int = 0

    def start(self) -> None:
        if self.began is None:
            self.began = time.perf_counter()
            self.on_start()


class LoadStudent(Student):
    """The benchmark client's student, plus what a crowd needs: page loads (not measured here)
    50 at a time and retried, since one refused among a thousand would stop the run, and the
    ``queue`` events, which the shared client does not measure, noted per answer."""

    def __init__(self, collector: Collector, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.collector = collector

    async def open(self) -> None:
        for attempt in range(3):
            try:
                async with self.collector.pages:
                    return await super().open()
            except BenchmarkError:
                if attempt == 2:
                    raise
                self.collector.page_retries += 1
                await asyncio.sleep(1 + attempt)

    async def ask(self, prompt: str, **kwargs: Any) -> Sample:
        self.collector.start()  # every page is loaded: the measured run begins
        return await super().ask(prompt, **kwargs)

    async def _read(self, response: httpx.Response, sample: Sample, sent: float) -> None:
        parser, raw = SSEParser(), response.aiter_raw
        noted = self.collector.queue

        async def watched(*args: Any, **kwargs: Any) -> Any:
            async for chunk in raw(*args, **kwargs):
                at = (time.perf_counter() - sent) * 1000
                for event in parser.feed(chunk):
                    if event.event == "queue":
                        position = json.loads(event.data)["position"]
                        seen = noted.setdefault(sample.index, {"first_ms": at, "first": position})
                        seen["last_ms"], seen["last"] = at, position
                yield chunk

        response.aiter_raw = watched  # type: ignore[method-assign]
        await super()._read(response, sample, sent)


@dataclass(frozen=True, slots=True)
class CrowdPlan(LoadPlan):
    collector: Collector = field(default_factory=Collector)

    def student(self) -> Student:
        # A class of STUDENTS_PER_ADDRESS per loopback address, as schools sit behind NATs:
        # the site's per-address limits (docs/deploy.md) then see classes, not one flood.
        number = self.collector.students
        self.collector.students += 1
        source = class_address(number)
        return LoadStudent(
            self.collector,
            base_url=self.base_url,
            path=self.path,
            timeout=self.timeout,
            source=source,
        )


def measure(
    url: str, *, students: int, requests: int, timeout: float, cap_s: float, meter: "Meter"
) -> dict[str, Any]:
    """One closed-loop run; its summary, the CPU it cost and what the time cap cut off."""
    collector = Collector(on_start=meter.start)
    plan = CrowdPlan(
        base_url=url,
        prompts=QUESTIONS,
        requests=requests,
        concurrency=students,
        timeout=timeout,
        collector=collector,
    )

    async def run() -> float:
        try:
            async with asyncio.timeout(cap_s):
                return (await run_benchmark(plan, on_sample=collector.samples.append)).duration_s
        except TimeoutError:
            collector.start()  # (a run cut off before its first question measured nothing)
            assert collector.began is not None
            return time.perf_counter() - collector.began

    duration = asyncio.run(run())
    cpu = meter.stop()
    summary = summarize(RunResult(plan, collector.samples, duration))
    return {
        "summary": asdict(summary),
        "cut_off": requests - len(collector.samples),
        "page_retries": collector.page_retries,
        "cpu": cpu,
        "samples": collector.samples,
        "queue": collector.queue,
    }


async def page_burst(url: str, visits: int) -> dict[str, Any]:
    """``visits`` first visits to the page at once, each a new browser: the answers by status
    and how long the successful ones took."""

    numbers = iter(range(visits))

    async def visit() -> tuple[str, float]:
        sent = time.perf_counter()
        transport = httpx.AsyncHTTPTransport(local_address=class_address(next(numbers)))
        async with httpx.AsyncClient(timeout=60, transport=transport) as client:
            try:
                status = str((await client.get(url + "/")).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
        return status, (time.perf_counter() - sent) * 1000

    answers = await asyncio.gather(*(visit() for _ in range(visits)))
    took = [ms for status, ms in answers if status == "200"]
    statuses = Counter(status for status, _ in answers)
    return {"statuses": dict(statuses.most_common()), "ms": [_p(took, 50), _p(took, 99)]}


# --- what the machine spends ------------------------------------------------------------------


def _processes() -> dict[int, tuple[str, int, float, str]]:
    """pid -> (command name, parent pid, CPU seconds, command line) of every process."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        found[int(entry.name)] = (name, int(fields[1]), cpu, cmdline)
    return found


def _machine() -> dict[str, float]:
    """CPU seconds of the whole machine since boot: in processes (user and system), in
    interrupts (the loopback's packets are mostly handled there), taken by the hypervisor
    (steal), and in all."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(v) / TICK for v in Path("/proc/stat").read_text().split()[1:9]
    )
    return {
        "processes": user + nice + system,
        "interrupts": irq + softirq,
        "steal": steal,
        "total": user + nice + system + idle + iowait + irq + softirq + steal,
    }


def _listen_overflows() -> int:
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()]
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names[0] == "TcpExt:":
            return int(values[names.index("ListenOverflows")])
    return 0


class Meter:
    """CPU seconds by role between ``start`` and ``stop``: the roles are named by ``roles``
    (pid -> role, their child processes included), PostgreSQL backends of ``database``, Redis,
    this client, and the rest of the machine."""

    def __init__(self, roles: dict[int, str], database: str = "") -> None:
        self.roles, self.database = roles, database
        self.before: dict[int, float] = {}
        self.machine: dict[str, float] = {}
        self.began = self.overflows = 0.0

    def _role(self, pid: int, info: dict[int, tuple[str, int, float, str]]) -> str | None:
        name, parent, _, cmdline = info[pid]
        if pid == os.getpid():
            return "client"
        if pid in self.roles:
            return self.roles[pid]
        if parent in self.roles:
            return self.roles[parent]
        if name == "redis-server":
            return "Redis"
        if self.database and name == "postgres" and f" {self.database} " in cmdline:
            return "PostgreSQL"
        return None

    def _by_pid(self) -> dict[int, float]:
        return {pid: cpu for pid, (_, _, cpu, _) in _processes().items()}

    def start(self) -> None:
        self.before = self._by_pid()
        self.machine, self.began = _machine(), time.perf_counter()
        self.overflows = _listen_overflows()

    def stop(self, digits: int = 1) -> dict[str, Any]:
        """The CPU seconds by role since ``start`` (rounded to ``digits``), and the machine's."""
        info, machine = _processes(), _machine()
        wall = time.perf_counter() - self.began
        spent_by = {k: v - self.machine[k] for k, v in machine.items()}
        spent: Counter[str] = Counter()
        others: Counter[str] = Counter()  # by command name, to tell what else ran
        for pid, (name, _, cpu, _) in info.items():
            role = self._role(pid, info)
            (spent if role else others)[role or name] += cpu - self.before.get(pid, 0.0)
        spent["other"] = spent_by["processes"] - sum(spent.values())
        return {
            **{role: round(seconds, digits) for role, seconds in spent.items()},
            "other_top": {k: round(v, 1) for k, v in others.most_common(3) if v >= 0.5},
            "interrupts": round(spent_by["interrupts"], 1),
            "steal": round(spent_by["steal"], 1),
            "busy": round(spent_by["processes"] + spent_by["interrupts"], 1),
            "capacity": round(spent_by["total"], 1),
            "wall_s": round(wall, 1),
            "listen_overflows": _listen_overflows() - self.overflows,
        }


# --- the machine must be ours ------------------------------------------------------------------


def wait_for_quiet(max_wait_s: float, idle_wait_s: float) -> None:
    """Wait (looking every 30 s) while benchmarks/added_latency.py runs on this machine, and then
    for up to ``idle_wait_s`` while other work keeps more than a quarter of its CPU busy."""
    deadline = time.monotonic() + max_wait_s
    while subprocess.run(["pgrep", "-f", "added_latency.py"], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            sys.exit("benchmarks/added_latency.py is still running: not measuring beside it.")
        print("waiting: benchmarks/added_latency.py is running", file=sys.stderr, flush=True)
        time.sleep(30)
    deadline = time.monotonic() + idle_wait_s
    while True:
        before = _machine()
        time.sleep(3)
        spent = {k: v - before[k] for k, v in _machine().items()}
        share = (spent["processes"] + spent["interrupts"]) / max(spent["total"], 1e-9)
        if share < 0.25 or time.monotonic() > deadline:
            print(f"machine {share:.0%} busy before the run", file=sys.stderr, flush=True)
            return
        print(f"waiting: the machine is {share:.0%} busy", file=sys.stderr, flush=True)
        time.sleep(27)


def log_sizes(folder: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in folder.glob("**/*.log")}


def logged_since(sizes: dict[Path, int]) -> dict[str, int]:
    """What nginx and the workers logged (warnings and worse) after ``sizes``, by kind: each
    message with its numbers and ids blanked."""
    kinds: Counter[str] = Counter()
    for path, size in sizes.items():
        with path.open("rb") as log:
            log.seek(size)
            text = log.read().decode(errors="replace")
        for line in text.splitlines():
            if found := re.search(r"\[(\w+)\] \d+#\d+: (?:\*\d+ )?(.*?)(?:, client: |$)", line):
                kind = f"nginx {found[1]}: {found[2]}"
            elif found := re.match(r"\S+ \S+ (WARNING|ERROR|CRITICAL) +(.*)", line):
                kind = f"worker {found[1].lower()}: {found[2]}"
            else:
                continue
            kinds[re.sub(r"[0-9a-f]{32}|\d+", "N", kind)[:140]] += 1
    return dict(kinds.most_common(8))


def raise_open_files() -> int:
    """The client (and the servers it starts) may hold as many descriptors as allowed."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# --- figures ---------------------------------------------------------------------------------


def _p(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 1) if values else None


def _minus(value: float | None, engine: float) -> float | None:
    return None if value is None else round(value - engine, 1)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def latency_row(
    setup: str, streams: int, result: dict[str, Any], *, ttft: float, itl: float
) -> dict[str, Any]:
    """The figures of one run, with what the engine's own delays leave over."""
    summary, ok = result["summary"], [s for s in result["samples"] if s.outcome == "ok"]
    ttfts = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    gaps = [gap for s in ok for gap in s.itl_ms]
    e2e = [s.e2e_ms for s in ok if s.e2e_ms is not None]
    errors = {k: v for k, v in summary["outcomes"].items() if k != "ok"}
    if result["cut_off"]:
        errors["not asked or cut off by the time cap"] = result["cut_off"]
    return {
        "setup": setup,
        "streams": streams,
        "requests": summary["requests"],
        "ok": summary["ok"],
        "errors": errors,
        "duration_s": summary["duration_s"],
        "requests_per_s": summary["request_throughput"],
        "tokens_per_s": summary["token_throughput"],
        "ttft_ms": [_p(ttfts, q) for q in (50, 95, 99)],
        "added_ttft_ms": [_minus(_p(ttfts, q), ttft) for q in (50, 95, 99)],
        "itl_ms": [_p(gaps, 50), _p(gaps, 99)],
        "added_itl_p99_ms": _minus(_p(gaps, 99), itl),
        "e2e_ms": [_p(e2e, 50), _p(e2e, 99)],
        "server_ttft_p50_ms": summary["server_ttft_ms_p50"],
        "engine_ttft_p50_ms": summary["engine_ttft_ms_p50"],
        "page_retries": result["page_retries"],
        "cpu": result["cpu"],
    }


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def _join(values: list[float | None]) -> str:
    return " / ".join(map(_ms, values)) + " ms"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def latency_table(rows: list[dict[str, Any]]) -> str:
    header = "setup,streams,requests,ok,errors,TTFT P50 / P95 / P99,added TTFT P50 / P99,"
    header += "ITL P50 / P99,added ITL P99,E2E P50 / P99,req/s"
    return markdown(
        header.split(","),
        [
            [
                row["setup"],
                *(f"{row[k]:,}" for k in ("streams", "requests", "ok")),
                _counts(row["errors"]),
                _join(row["ttft_ms"]),
                _join(row["added_ttft_ms"][::2]),
                _join(row["itl_ms"]),
                _join([row["added_itl_p99_ms"]]),
                _join(row["e2e_ms"]),
                f"{row['requests_per_s']:.1f}",
            ]
            for row in rows
        ],
    )


def visits_table(rows: list[dict[str, Any]]) -> str:
    header = ["setup", "first visits at once", "answers", "P50 / P99 of the 200s"]
    return markdown(
        header,
        [
            [row["setup"], f"{row['streams']:,}", _counts(burst["statuses"]), _join(burst["ms"])]
            for row in rows
            if (burst := row.get("first_visits_at_once"))
        ],
    )


#: With both servers, each pool's CPU apart, by the prefix of its workers' unit names.
POOL_ROLES = {"chatsite@": "daphne workers", "chatsite-uvicorn@": "uvicorn workers"}


def process_role(name: str, *, pools: bool) -> str:
    """The CPU role of the stack's process ``name`` (nginx, or a worker's unit)."""
    if name == "nginx":
        return "nginx"
    if pools:
        return next((r for prefix, r in POOL_ROLES.items() if name.startswith(prefix)), "workers")
    return "workers"


def server_rows(
    result: dict[str, Any], servers: dict[str, str], *, ttft: float, itl: float
) -> list[dict[str, Any]]:
    """One run's answers by the server that answered them (``servers``: request id -> server,
    from the stream records): the client's figures, and each pool's CPU per answer."""
    rows = []
    for name in sorted(set(servers.values())):
        mine = [s for s in result["samples"] if servers.get(s.request_id or "") == name]
        ok = [s for s in mine if s.outcome == "ok"]
        ttfts = [s.ttft_ms for s in ok if s.ttft_ms is not None]
        gaps = [gap for s in ok for gap in s.itl_ms]
        cpu = result["cpu"].get(f"{name} workers")
        rows.append(
            {
                "server": name,
                "requests": len(mine),
                "ok": len(ok),
                "added_ttft_ms": [_minus(_p(ttfts, q), ttft) for q in (50, 95, 99)],
                "added_itl_p99_ms": _minus(_p(gaps, 99), itl),
                "server_ttft_p50_ms": _p(
                    [s.server_ttft_ms for s in ok if s.server_ttft_ms is not None], 50
                ),
                "cpu_ms_per_answer": round(1000 * cpu / len(ok), 2) if cpu and ok else None,
            }
        )
    return rows


def server_table(rows: list[dict[str, Any]]) -> str:
    """The answers of each level by server (a site with a pool of each)."""
    header = "streams,server,requests,ok,added TTFT P50 / P95 / P99,added ITL P99,"
    header += "server TTFT P50,worker CPU per answer"
    table = [
        [
            f"{row['streams']:,}",
            part["server"],
            f"{part['requests']:,}",
            f"{part['ok']:,}",
            _join(part["added_ttft_ms"]),
            _join([part["added_itl_p99_ms"]]),
            _join([part["server_ttft_p50_ms"]]),
            _join([part["cpu_ms_per_answer"]]),
        ]
        for row in rows
        for part in row.get("by_server", [])
    ]
    return markdown(header.split(","), table)


def cpu_table(rows: list[dict[str, Any]]) -> str:
    """CPU seconds by role over the measured run, and per successful request."""
    roles = ["workers", *POOL_ROLES.values(), "worker", "nginx", "client", "PostgreSQL", "Redis"]
    roles = [r for r in roles if any(r in row["cpu"] for row in rows)]
    table = []
    for row in rows:
        cpu, ok = row["cpu"], max(row["ok"], 1)
        busy = 100 * cpu["busy"] / max(cpu["capacity"], 1e-9)
        table.append(
            [row["setup"], f"{row['streams']:,}", f"{cpu['wall_s']:.1f} s", f"{busy:.0f}%"]
            + [f"{cpu[r]:.1f} s ({1000 * cpu[r] / ok:.0f} ms/req)" for r in roles]
            + [f"{cpu['other']:.1f} s ({_counts(cpu['other_top'])})"]
            + [f"{cpu['interrupts']:.1f} s", f"{cpu['steal']:.1f} s"]
            + [str(cpu["listen_overflows"])]
        )
    header = ["setup", "streams", "wall", "machine busy", *roles, "other processes"]
    header += ["interrupts", "steal", "listen overflows"]
    return markdown(header, table)


# --- the scenarios -----------------------------------------------------------------------------


def records_server(stack: LoopbackStack) -> dict[str, str]:
    """Request id -> the server of the worker that stored its stream record."""
    out = stack.sql("SELECT request_id || ' ' || server FROM assistant_streamrecord")
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def production(args: argparse.Namespace, timeout: float) -> list[dict[str, Any]]:
    largest = max(args.streams)
    env = {
        "CHATSITE_SCRIPTED_TTFT_MS": str(args.ttft_ms),
        "CHATSITE_SCRIPTED_ITL_MS": str(args.itl_ms),
        "CHATSITE_SCRIPTED_TOKENS": str(args.tokens),
        # Whichever worker the sessions hash to may run the whole load.
        "CHATSITE_MAX_STREAMS": str(largest),
    }
    setups = []
    if "nginx" in args.setups:
        kind = "Daphne and uvicorn" if args.server == "both" else args.server
        label = f"nginx + {args.workers} {kind} worker" + ("s" if args.workers > 1 else "")
        setups.append((label, args.workers, False, args.streams))
    if "direct" in args.setups:
        setups.append(("1 worker, no nginx", 1, True, [largest]))
    rows = []
    for label, workers, direct, levels in setups:
        wait_for_quiet(args.max_wait_s, args.idle_wait_s)
        with (
            tempfile.TemporaryDirectory(prefix="chatsite-load-") as tmp,
            LoopbackStack(
                Path(tmp) / "stack",
                workers=workers,
                # One worker, no nginx: Daphne's when the site runs both servers.
                server="daphne" if direct and args.server == "both" else args.server,
                env=env,
                # Two connections per stream, and the page loads and idle upstream ones.
                worker_connections=max(WORKER_CONNECTIONS, 3 * largest),
                nginx_edits=CROWD_RATES,
            ) as stack,
        ):
            assert stack.state is not None
            pools = stack.server == "both"
            roles = {
                p.pid: process_role(name, pools=pools) for name, p in stack.state.processes.items()
            }
            url = f"http://127.0.0.1:{stack.state.workers[0]}" if direct else stack.url
            # Warm the workers (imports, pools, prepared statements); not recorded.
            measure(url, students=10, requests=20, timeout=60, cap_s=60, meter=Meter({}))
            for streams in levels:
                wait_for_quiet(args.max_wait_s, args.idle_wait_s)
                burst = asyncio.run(page_burst(url, streams))
                # Let the workers settle, and nginx forget any worker the burst got marked as
                # failed (fail_timeout: 10 s), before the streams.
                time.sleep(15)
                sizes = log_sizes(stack.work)
                result = measure(
                    url,
                    students=streams,
                    requests=args.rounds * streams,
                    timeout=timeout,
                    cap_s=args.cap_s,
                    meter=Meter(roles, stack.name),
                )
                row = latency_row(label, streams, result, ttft=args.ttft_ms, itl=args.itl_ms)
                row["first_visits_at_once"] = burst
                row["logged"] = logged_since(sizes)
                if pools and not direct:
                    row["by_server"] = server_rows(
                        result, records_server(stack), ttft=args.ttft_ms, itl=args.itl_ms
                    )
                rows.append(row)
                print(latency_table([row]).splitlines()[-1], file=sys.stderr, flush=True)
    return rows


def embedded(args: argparse.Namespace, timeout: float) -> list[dict[str, Any]]:
    wait_for_quiet(args.max_wait_s, args.idle_wait_s)
    # The development profile, as scripts/run starts it: SQLite, one worker.
    os.environ.pop("DATABASE_URL", None)
    env = {
        "CHATSITE_ENGINE": "llamacpp",
        "CHATSITE_MAX_TOKENS": str(args.max_tokens),
        "CHATSITE_DEBUG": "0",
        "DJANGO_SECRET_KEY": "benchmark-only-secret-key-0123456789abcdefghijkl",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CHATSITE_TLS": "0",
        # The shipped defaults, whatever this shell's environment says.
        "CHATSITE_CHAT_RATE": "30",
        "CHATSITE_RESUME_GRACE_S": "30",
        # No cap on first visits per address, as in the runs docs/performance.md reports.
        "CHATSITE_NEW_SESSIONS_PER_MINUTE": "100000",
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="chatsite-load-") as tmp:
        db = str(Path(tmp) / "load.sqlite3")
        migrate = [sys.executable, "manage.py", "migrate", "-v0"]
        subprocess.run(
            migrate, cwd=ROOT, env={**os.environ, **env, "CHATSITE_SQLITE_PATH": db}, check=True
        )
        server = start_daphne(workdir=Path(tmp), db_path=db, env=env)
        try:
            roles = {server.process.pid: "worker"}
            # One student alone first: the model's own TTFT, which the crowd's is compared with.
            solo = measure(
                server.url, students=1, requests=5, timeout=120, cap_s=120, meter=Meter(roles)
            )
            sizes = log_sizes(Path(tmp))
            crowd = measure(
                server.url,
                students=args.students,
                requests=args.students,
                timeout=timeout,
                cap_s=args.cap_s,
                meter=Meter(roles),
            )
            crowd["logged"] = logged_since(sizes)
        finally:
            server.stop()
    for label, result in (("alone", solo), (f"{args.students} at once", crowd)):
        row = latency_row(label, result["summary"]["requests"], result, ttft=0.0, itl=0.0)
        rows.append({**row, **queue_figures(result, solo), "logged": result.get("logged", {})})
    return rows


def queue_figures(result: dict[str, Any], solo: dict[str, Any]) -> dict[str, Any]:
    """How long answers waited for the model. ``engine_ttft`` runs from handing the question
    to the engine to its first token, so it holds the wait in line and the model's own time to
    its first token; the model's own is what it took with nobody else asking."""
    ok = [s for s in result["samples"] if s.outcome == "ok"]
    alone = [s.engine_ttft_ms for s in solo["samples"] if s.engine_ttft_ms is not None]
    own = statistics.median(alone) if alone else 0.0
    engine = [s.engine_ttft_ms for s in ok if s.engine_ttft_ms is not None]
    waits = [max(0.0, e - own) for e in engine]
    queued = result["queue"]
    ttfts = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    return {
        "model_ttft_alone_ms": round(own, 1),
        "engine_ttft_ms": [_p(engine, q) for q in (50, 95, 99)],
        "queue_wait_ms": [_p(waits, q) for q in (50, 95, 99)] + [max(waits, default=None)],
        "told_their_place": len(queued),
        "first_place_max": max((q["first"] for q in queued.values()), default=None),
        "ttft_over_60_s": sum(t > 60_000 for t in ttfts),
        "ttft_max_ms": max(ttfts, default=None),
    }


def embedded_table(rows: list[dict[str, Any]]) -> str:
    header = "students,ok,errors,TTFT P50 / P95 / P99 / max,engine TTFT P50 / P95 / P99,"
    header += "wait in line P50 / P95 / P99 / max,told their place (highest),TTFT > 60 s,"
    header += "E2E P50 / P99,tokens/s"
    return markdown(
        header.split(","),
        [
            [
                row["setup"],
                str(row["ok"]),
                _counts(row["errors"]),
                _join([*row["ttft_ms"], row["ttft_max_ms"]]),
                _join(row["engine_ttft_ms"]),
                _join(row["queue_wait_ms"]),
                f"{row['told_their_place']} ({row['first_place_max'] or '-'})",
                str(row["ttft_over_60_s"]),
                _join(row["e2e_ms"]),
                f"{row['tokens_per_s']:.1f}",
            ]
            for row in rows
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", nargs="*", choices=["production", "embedded"])
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--workers", type=int, default=2, help="workers behind nginx")
    add_server_option(parser)
    parser.add_argument("--rounds", type=int, default=3, help="questions per student")
    parser.add_argument(
        "--setups",
        nargs="+",
        choices=["nginx", "direct"],
        default=["nginx", "direct"],
        help="nginx: --workers behind nginx, each level; direct: 1 worker, the largest level",
    )
    parser.add_argument("--ttft-ms", type=int, default=100, help="scripted engine")
    parser.add_argument("--itl-ms", type=int, default=50, help="scripted engine")
    parser.add_argument("--tokens", type=int, default=40, help="scripted engine")
    parser.add_argument("--students", type=int, default=100, help="embedded scenario")
    parser.add_argument("--max-tokens", type=int, default=32, help="embedded scenario")
    parser.add_argument("--timeout", type=float, help="per request (60 s; embedded 300 s)")
    parser.add_argument("--cap-s", type=float, default=240, help="time cap of one run")
    parser.add_argument(
        "--max-wait-s", type=float, default=1800, help="for added_latency.py to end, then stop"
    )
    parser.add_argument(
        "--idle-wait-s", type=float, default=300, help="for other work to calm, then go on"
    )
    parser.add_argument("--json", type=Path, help="write the rows and summaries here")
    args = parser.parse_args()
    scenarios = args.scenario or ["production", "embedded"]
    limit = raise_open_files()
    print(f"open files: {limit}; cores: {os.cpu_count()}", file=sys.stderr)
    document: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    for scenario in scenarios:
        if scenario == "production":
            rows = production(args, args.timeout or 60.0)
            tables = [latency_table(rows), cpu_table(rows), visits_table(rows)]
            if any("by_server" in row for row in rows):
                tables.append(server_table(rows))
        else:
            # Waiting in line for the model is the point here: a browser would wait on too.
            rows = embedded(args, args.timeout or 300.0)
            tables = [embedded_table(rows), cpu_table(rows)]
        logged = [f"{row['setup']}, {row['streams']:,}: {_counts(row['logged'])}" for row in rows]
        print("\n\n".join([*tables, "Logged:\n" + "\n".join(logged)]) + "\n", flush=True)
        document[scenario] = rows
        if args.json:
            args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
