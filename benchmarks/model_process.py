"""What running the model in its own process costs, and how fast it recovers.

1. The hop: the same engine in this process (the baseline) and behind the model process's
   Unix socket, taking turns, one request at a time. TTFT is the time from asking to the first
   piece of text; ITL the gaps between pieces. The scripted engine (its own TTFT and gaps fixed)
   shows the hop alone; the real SmolLM2 shows it beside the model's own variation.
2. Cancel: from closing a request's connection to the engine in the model process stopping it
   (scripted engine, which records the moment), and to the next student's first token when the
   closed one was being decoded (real model).
3. Crash: from SIGKILL to the model process to the stream's engine_crashed, to the new model
   process answering, and to the next question's first token, asked at once (real model). The
   crashes follow each other, so the supervisor waits 0, 0.5, 1 s ... before each restart; keep
   ``--crashes`` at 4 or less, or the wait exceeds what a question is held for (2 s) and the
   next question is refused with engine_restarting, as a crash loop should be.

    python benchmarks/model_process.py [--requests 200] [--model-rounds 12] [--crashes 3]
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assistant.benchmarking.servers import ModelHost  # noqa: E402
from assistant.benchmarking.stats import percentile  # noqa: E402
from assistant.engines import BaseEngine, ChatMessage, EngineError, GenerationParams  # noqa: E402
from assistant.engines.llamacpp import LlamaCppEngine  # noqa: E402
from assistant.engines.model_process import ModelProcessEngine  # noqa: E402
from assistant.engines.scripted import ScriptedEngine  # noqa: E402

SCRIPTED = "assistant.engines.scripted.ScriptedEngine"
QUESTIONS = [
    "Why is the sky blue?",
    "Name three colours of the rainbow.",
    "Explain photosynthesis in two sentences.",
    "What is Newton's first law?",
]
GREEDY = GenerationParams(max_tokens=48, temperature=0.0, repeat_penalty=1.15)
LONG = "Write a very long story about a dragon who learns to read."


async def timed(
    engine: BaseEngine, question: str, params: GenerationParams
) -> tuple[float, list[float]]:
    """TTFT and the gaps between pieces of one answer, in ms."""
    sent = time.perf_counter()
    stamps: list[float] = []
    async for delta in engine.stream([ChatMessage("user", question)], params):
        if delta.text:
            stamps.append(time.perf_counter())
    return (stamps[0] - sent) * 1000, [(b - a) * 1000 for a, b in pairwise(stamps)]


def summary(ttft: list[float], gaps: list[float]) -> dict[str, float]:
    return {
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "itl_p50": percentile(gaps, 50),
        "itl_p95": percentile(gaps, 95),
    }


async def hop(engines: dict[str, BaseEngine], questions: list[str], params: GenerationParams,
              rounds: int) -> dict[str, dict[str, float]]:  # fmt: skip
    """Each engine answers each question in turn, ``rounds`` times, alternating."""
    ttft: dict[str, list[float]] = {name: [] for name in engines}
    gaps: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():  # warm up: load, first prompt
        await timed(engine, questions[0], params)
    for _ in range(rounds):
        for question in questions:
            for name, engine in engines.items():
                first, between = await timed(engine, question, params)
                ttft[name].append(first)
                gaps[name].extend(between)
    return {name: summary(ttft[name], gaps[name]) for name in engines}


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def cancel_scripted(host: ModelHost, events_file: Path, count: int) -> list[float]:
    """ms from closing a decoding request's connection to the engine's cancel, as the scripted
    engine in the model process records it (time.monotonic is one clock for both)."""
    engine = ModelProcessEngine("bench", {"SOCKET": str(host.socket)})
    delays = []
    for _ in range(count):
        stream = engine.stream([ChatMessage("user", "[scripted tokens=50 itl_ms=10]")], GREEDY)
        await anext(stream)
        before = len([e for e in events(events_file) if e["event"] == "cancel"])
        closed = time.monotonic()
        await stream.aclose()
        cancels: list[dict[str, Any]] = []
        while len(cancels) <= before:  # the file is written by another process: poll it
            cancels = [e for e in events(events_file) if e["event"] == "cancel"]
            await asyncio.sleep(0.0005)
        delays.append((cancels[-1]["t"] - closed) * 1000)
    return delays


async def cancel_model(host: ModelHost, rounds: int) -> list[float]:
    """ms from closing the answer being decoded to the first token of the one waiting."""
    engine = ModelProcessEngine("bench", {"SOCKET": str(host.socket)})
    waits = []
    for _ in range(rounds):
        first = engine.stream([ChatMessage("user", LONG)], GenerationParams(max_tokens=400))
        while not (await anext(first)).text:
            pass
        second = engine.stream([ChatMessage("user", QUESTIONS[0])], GREEDY)
        heard = await anext(second)  # its place in line: it waits behind the first
        assert heard.queue_position == 1, heard
        closed = time.perf_counter()
        await first.aclose()
        while not (await anext(second)).text:
            pass
        waits.append((time.perf_counter() - closed) * 1000)
        await second.aclose()
    return waits


async def crash(host: ModelHost, count: int) -> dict[str, list[float]]:
    engine = ModelProcessEngine("bench", {"SOCKET": str(host.socket)})
    found: dict[str, list[float]] = {"error_ms": [], "up_ms": [], "next_ttft_ms": []}
    for _ in range(count):
        before = host.wait_until(lambda status: status.state == "up").restarts
        stream = engine.stream([ChatMessage("user", LONG)], GenerationParams(max_tokens=400))
        while not (await anext(stream)).text:
            pass
        host.kill_runner(signal.SIGKILL)
        killed = time.perf_counter()
        try:
            async for _ in stream:
                pass
        except EngineError as exc:
            assert exc.code == "engine_crashed", exc
        found["error_ms"].append((time.perf_counter() - killed) * 1000)
        # Asked at once: it waits in the socket's backlog until the new process has loaded.
        await timed(engine, QUESTIONS[0], GREEDY)
        found["next_ttft_ms"].append((time.perf_counter() - killed) * 1000)
        status = host.status()
        assert status.state == "up" and status.restarts == before + 1, status
        # The supervisor logs how long each model process took from its start to ready.
        ready = [line for line in host.log.read_text().splitlines() if " ready in " in line]
        found["up_ms"].append(float(ready[-1].split(" ready in ")[1].split(" ms")[0]))
    return found


def table(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'':24} {'TTFT P50':>9} {'TTFT P95':>9} {'ITL P50':>9} {'ITL P95':>9}   (ms)")
    for name, row in rows.items():
        cells = " ".join(f"{row[k]:9.3f}" for k in ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95"))
        print(f"{name:24} {cells}")
    names = list(rows)
    if len(names) == 2:
        a, b = rows[names[0]], rows[names[1]]
        added = " ".join(
            f"{b[k] - a[k]:+9.3f}" for k in ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95")
        )
        print(f"{'added by the hop':24} {added}")


def each(name: str, values: list[float]) -> None:
    print(f"{name:44} " + "  ".join(f"{v:8.1f}" for v in values))


def spread(name: str, values: list[float]) -> None:
    print(f"{name:40} P50 {percentile(values, 50):8.1f}  max {max(values):8.1f}  (n={len(values)})")


async def main(args: argparse.Namespace) -> None:
    threads = args.threads
    with tempfile.TemporaryDirectory(prefix="chatsite-mp-") as tmp:
        work = Path(tmp)
        events_file = work / "events.jsonl"
        scripted_options = {
            "TTFT_MS": 50,
            "ITL_MS": 10,
            "TOKENS": 20,
            "EVENTS_FILE": str(events_file),
        }
        host = ModelHost(work / "scripted.log", backend=SCRIPTED, options=scripted_options)
        try:
            remote = ModelProcessEngine("bench", {"SOCKET": str(host.socket)})
            local = ScriptedEngine(
                "bench", {k: v for k, v in scripted_options.items() if k != "EVENTS_FILE"}
            )
            params = GenerationParams(max_tokens=64)
            per_round = max(1, args.requests // len(QUESTIONS))
            table(
                "Scripted engine, 50 ms to the first token, 20 tokens 10 ms apart",
                await hop(
                    {"in-process": local, "model process": remote}, QUESTIONS, params, per_round
                ),
            )
            zero = ["[scripted ttft_ms=0 itl_ms=0 tokens=20]"]
            table(
                "Scripted engine, no delays: the cost of the hop itself",
                await hop(
                    {"in-process": local, "model process": remote}, zero, params, args.requests
                ),
            )
            print()
            spread("close -> engine cancelled (ms)", await cancel_scripted(host, events_file, 50))
        finally:
            host.stop()

        if args.model_rounds:
            env = {"CHATSITE_LLAMACPP_THREADS": str(threads)}
            host = ModelHost(work / "model.log", env=env)
            try:
                local_model = LlamaCppEngine("bench", {"N_THREADS": threads, "N_CTX": 2048})
                local_model.load()
                remote = ModelProcessEngine("bench", {"SOCKET": str(host.socket)})
                rounds = max(1, args.model_rounds // len(QUESTIONS))
                table(
                    f"SmolLM2-135M, {threads} threads, greedy, 48 tokens",
                    await hop(
                        {"in-process": local_model, "model process": remote},
                        QUESTIONS,
                        GREEDY,
                        rounds,
                    ),
                )
                del local_model  # one model decoding at a time from here on
                print()
                spread("close decoding -> next first token (ms)", await cancel_model(host, 5))
                found = await crash(host, args.crashes)
                print(f"\nSIGKILL mid-answer, {args.crashes} in a row (restarts after 0, 0.5, 1 s)")
                each("SIGKILL -> stream gets engine_crashed (ms)", found["error_ms"])
                each("new model process: start -> ready (ms)", found["up_ms"])
                each("SIGKILL -> next question's first token (ms)", found["next_ttft_ms"])
            finally:
                host.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--model-rounds", type=int, default=12, help="0: skip the real model")
    parser.add_argument("--crashes", type=int, default=3)  # at most 4: see above
    parser.add_argument(
        "--threads", type=int, default=int(os.environ.get("CHATSITE_LLAMACPP_THREADS") or 2)
    )
    asyncio.run(main(parser.parse_args()))
