"""Portable against native llama.cpp builds: TTFT and decode speed of the embedded model.

Each build lives in a virtual environment of its own (scripts/setup installs the portable one
into .venv; ``CHATSITE_LLAMA_BUILD=native scripts/setup`` in another checkout makes a native
one). The builds take turns, one round each at a time, so a busy machine slows both alike. One
round loads SmolLM2 in a fresh process, answers each question once greedily, streaming, and
reports time to the first token and decode tokens per second after it.

    python benchmarks/llama_build.py --venv .venv --venv ../other/.venv [--rounds 5]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "Why is the sky blue?",
    "Name three colours of the rainbow.",
    "Explain photosynthesis in two sentences.",
    "What is Newton's first law?",
]


def measure(threads: int, max_tokens: int) -> dict[str, object]:
    """One round in this process: load, then each question's TTFT and decode speed."""
    sys.path.insert(0, str(ROOT))
    import llama_cpp

    from assistant.engines.llamacpp import default_model_path

    started = time.perf_counter()
    llama = llama_cpp.Llama(
        model_path=str(default_model_path()),
        n_ctx=1024,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    load_s = time.perf_counter() - started
    ttft: list[float] = []
    speed: list[float] = []
    for question in QUESTIONS:
        llama.reset()  # no KV-cache reuse between questions: every prompt is prefilled
        sent = time.perf_counter()
        first = last = 0.0
        pieces = 0
        for chunk in llama.create_chat_completion(
            messages=[{"role": "user", "content": question}],
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
        ):
            if chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
                pieces += 1
        ttft.append(first - sent)
        if pieces > 1:
            speed.append((pieces - 1) / (last - first))
    return {
        "load_s": load_s,
        "ttft_ms": [t * 1000 for t in ttft],
        "tokens_per_s": speed,
        "features": llama_cpp.llama_print_system_info().decode().strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", action="append", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.threads, args.max_tokens)))
        return

    results: dict[Path, list[dict[str, object]]] = {venv: [] for venv in args.venv}
    for _ in range(args.rounds):
        for venv in args.venv:
            out = subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    __file__,
                    "--worker",
                    "--venv",
                    str(venv),
                    *("--threads", str(args.threads), "--max-tokens", str(args.max_tokens)),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[venv].append(json.loads(out.strip().splitlines()[-1]))

    print(
        f"{args.rounds} rounds x {len(QUESTIONS)} questions, {args.threads} threads, "
        f"greedy, up to {args.max_tokens} tokens"
    )
    for venv, rounds in results.items():
        build = (
            (venv / "llama-build").read_text().split()[0]
            if (venv / "llama-build").is_file()
            else "?"
        )
        ttft = [t for r in rounds for t in r["ttft_ms"]]  # type: ignore[attr-defined]
        speed = [s for r in rounds for s in r["tokens_per_s"]]  # type: ignore[attr-defined]
        load = [r["load_s"] for r in rounds]
        print(
            f"{build:9} {venv}: TTFT P50 {statistics.median(ttft):.1f} ms "
            f"(min {min(ttft):.1f}, max {max(ttft):.1f}); decode P50 "
            f"{statistics.median(speed):.1f} tokens/s (min {min(speed):.1f}, "
            f"max {max(speed):.1f}); load P50 {statistics.median(load) * 1000:.0f} ms"  # type: ignore[arg-type]
        )
        print(f"          {rounds[0]['features']}")


if __name__ == "__main__":
    main()
