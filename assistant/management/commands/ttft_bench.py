"""``manage.py ttft_bench``: time to first token, measured the way browsers see it.

The measuring is ``assistant.benchmarking``; this command parses flags, shows progress on stderr,
prints the report on stdout and writes the optional JSON and histogram files. See
docs/benchmarking.md for every figure's definition.
"""

import asyncio
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from assistant.benchmarking import (
    STREAM_PATHS,
    BenchmarkError,
    EndpointNotFound,
    LoadPlan,
    RunResult,
    Sample,
    Summary,
    percentile,
    run_benchmark,
    summarize,
)

DEFAULT_PROMPT = "What is photosynthesis?"
ROWS = (
    ("headers", "headers_ms"),
    ("TTFB", "ttfb_ms"),
    ("TTFT", "ttft_ms"),
    ("ITL", "itl_ms"),
    ("TPOT", "tpot_ms"),
    ("E2E", "e2e_ms"),
)


class Progress:
    """A one-line progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, out: OutputWrapper, total: int, width: int = 30) -> None:
        self.out, self.total, self.width = out, total, width
        self.done = self.errors = 0
        self.began = self.drawn = time.perf_counter()

    def __call__(self, sample: Sample) -> None:
        self.done += 1
        self.errors += sample.outcome != "ok"
        now = time.perf_counter()
        if now - self.drawn >= 0.1 or self.done == self.total:
            self.drawn = now
            filled = self.width * self.done // self.total
            rate = self.done / max(now - self.began, 1e-9)
            bar = "#" * filled + "-" * (self.width - filled)
            line = f"\r[{bar}] {self.done}/{self.total}  errors {self.errors}  {rate:.1f} req/s"
            self.out.write(line, ending="", style_func=str)
            self.out.flush()

    def close(self) -> None:
        if self.done:
            self.out.write("", style_func=str)


def report(result: RunResult, summary: Summary) -> str:
    plan = result.plan
    if plan.rate is None:
        loop = f"closed loop, {plan.concurrency} students"
    else:
        loop = f"open loop, {plan.arrival} arrivals at {plan.rate:g}/s"
        loop += f", at most {plan.concurrency} in flight" if plan.concurrency else ""
    connection = "keep-alive connections" if plan.keepalive else "a new connection per request"
    lines = [
        f"POST {plan.stream_url}",
        f"{summary.requests} requests, {loop}, {connection}, {summary.duration_s:.2f} s",
        "",
        f"{'(ms)':<8}" + "".join(f"{h:>10}" for h in ("P50", "P95", "P99", "max", "mean", "n")),
    ]
    for name, attr in ROWS:
        dist = getattr(summary, attr)
        if dist is None:
            lines.append(f"{name:<8}" + f"{'-':>10}" * 5 + f"{0:>10}")
            continue
        figures = (dist.p50, dist.p95, dist.p99, dist.max, dist.mean)
        lines.append(f"{name:<8}" + "".join(f"{v:>10.1f}" for v in figures) + f"{dist.count:>10}")
    outcomes = ", ".join(f"{label} {count}" for label, count in summary.outcomes.items())
    lines += [
        "",
        f"outcomes     {outcomes}",
        f"throughput   {summary.request_throughput:.2f} requests/s, "
        f"{summary.token_throughput:.1f} tokens/s",
    ]
    if summary.server_ttft_ms_p50 is None:
        lines.append("server       no timings reported in `done` events")
    else:
        lines.append(
            f"server P50   server TTFT {summary.server_ttft_ms_p50:.1f} ms, engine TTFT "
            f"{_ms(summary.engine_ttft_ms_p50)}; client TTFT - server TTFT "
            f"{_ms(summary.client_minus_server_ttft_ms_p50)} (network + client)"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def draw_histogram(values: list[float], path: Path, *, title: str) -> None:
    """The TTFT distribution with P50/P95/P99 marked, drawn off-screen (Agg) into a PNG."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise CommandError("--histogram needs matplotlib: pip install 'chatsite[bench]'.") from exc
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.hist(values, bins=max(10, min(60, 2 * math.isqrt(len(values)))), color="#4c72b0")
    for q, style in ((50, "-"), (95, "--"), (99, ":")):
        x = percentile(values, q)
        axes.axvline(x, color="#c44e52", linestyle=style, label=f"P{q} {x:.1f} ms")
    axes.set(title=title, xlabel="TTFT (ms)", ylabel="requests")
    axes.legend()
    figure.savefig(path, format="png", dpi=100)


class Command(BaseCommand):
    help = (
        "Measure time to first token (and TTFB, inter-token latency, end-to-end) of the chat "
        "stream as browsers see it, against this site or any deployed URL."
    )
    requires_system_checks: list[str] = []  # a client: nothing local needs to be configured

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="the site's base URL")
        parser.add_argument("-n", "--requests", type=int, default=100, help="measured requests")
        parser.add_argument(
            "-c",
            "--concurrency",
            type=int,
            help="closed loop: students asking at once, each asking again when its answer ends "
            "(default 1); with --rate: the most requests in flight (default: no cap)",
        )
        parser.add_argument(
            "--rate",
            type=float,
            help="open loop: requests/s arriving whatever the server's speed (-c becomes a cap)",
        )
        parser.add_argument(
            "--arrival",
            choices=("poisson", "constant"),
            default="poisson",
            help="open loop: exponential or even gaps between arrivals",
        )
        parser.add_argument("--seed", type=int, help="seed of the Poisson arrivals")
        parser.add_argument(
            "--prompt", action="append", default=[], help="a question (repeatable; used in turn)"
        )
        parser.add_argument(
            "--prompts-file", type=Path, metavar="FILE", help="one question per line"
        )
        parser.add_argument(
            "--path",
            choices=tuple(STREAM_PATHS),
            default="auto",
            help=", ".join(f"{name}: {path}" for name, path in STREAM_PATHS.items()),
        )
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="seconds allowed per request (60)"
        )
        parser.add_argument("--warmup", type=int, default=0, help="unrecorded requests first")
        parser.add_argument("--keepalive", action="store_true", help="reuse each connection")
        parser.add_argument(
            "--json", type=Path, metavar="FILE", help="write every sample and the summary"
        )
        parser.add_argument(
            "--histogram", type=Path, metavar="FILE.png", help="draw the TTFT distribution"
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **options: Any) -> None:
        plan = self.plan(options)
        progress = None if options["no_progress"] else Progress(self.stderr, plan.requests)
        try:
            result = asyncio.run(run_benchmark(plan, on_sample=progress))
        except EndpointNotFound as exc:
            raise CommandError(
                f"{exc} This server has no {STREAM_PATHS[plan.path]} endpoint for "
                f"--path {plan.path}: check --url and --path."
            ) from exc
        except BenchmarkError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if progress is not None:
                progress.close()
        summary = summarize(result)
        self.stdout.write(report(result, summary))
        if options["json"]:
            document = {
                "plan": asdict(plan),
                "summary": asdict(summary),
                "samples": [sample.as_dict() for sample in result.samples],
            }
            options["json"].write_text(json.dumps(document, indent=2) + "\n")
        if summary.ok == 0:
            raise CommandError("No request succeeded: see the outcomes above.")
        ttfts = [s.ttft_ms for s in result.samples if s.outcome == "ok" and s.ttft_ms is not None]
        if options["histogram"] and ttfts:
            title = f"TTFT of {len(ttfts)} requests to {plan.stream_url}"
            draw_histogram(ttfts, options["histogram"], title=title)
        elif options["histogram"]:
            self.stderr.write("No answer had a token: no histogram drawn.")

    def plan(self, options: dict[str, Any]) -> LoadPlan:
        prompts = list(options["prompt"])
        if options["prompts_file"]:
            try:
                text = options["prompts_file"].read_text(encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"Cannot read --prompts-file: {exc}") from exc
            prompts += [line.strip() for line in text.splitlines() if line.strip()]
        if not options["url"].startswith(("http://", "https://")):
            raise CommandError("--url must start with http:// or https://")
        for name in ("requests", "concurrency"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(f"--{name} must be at least 1.")
        if options["rate"] is not None and options["rate"] <= 0:
            raise CommandError("--rate must be above 0.")
        if options["timeout"] <= 0 or options["warmup"] < 0:
            raise CommandError("--timeout must be above 0 and --warmup at least 0.")
        concurrency = options["concurrency"]
        return LoadPlan(
            base_url=options["url"],
            prompts=prompts or [DEFAULT_PROMPT],
            requests=options["requests"],
            concurrency=concurrency if concurrency or options["rate"] else 1,
            rate=options["rate"],
            arrival=options["arrival"],
            path=options["path"],
            timeout=options["timeout"],
            warmup=options["warmup"],
            keepalive=options["keepalive"],
            seed=options["seed"],
        )
