"""Does the embedded model loop? Sampling settings side by side on the real SmolLM2.

Small models fall into repeating one sentence until the token cap, most of all when asked in a
language they barely speak. For each setting this asks the same questions (Chinese and English)
with fixed seeds and prints how often the most repeated sentence occurs, how many tokens the
answer took and how many answers ran into the cap. The baseline row is llama.cpp's neutral
sampling (no penalties); the engine's defaults (``LlamaCppEngine.default_generation``) are
marked.

    python benchmarks/sampling_loops.py [--seeds 3] [--max-tokens 512]
"""

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

from assistant.benchmarking.repetition import most_repeated
from assistant.engines.base import GenerationParams
from assistant.engines.llamacpp import LlamaCppEngine, default_model_path, sampling_arguments

SYSTEM = "You are a patient, friendly teaching assistant. Answer clearly and briefly."
QUESTIONS = [
    "天空为什么是蓝色的？",
    "请解释一下光合作用。",
    "什么是牛顿第一定律？",
    "Why is the sky blue?",
    "Explain photosynthesis to a twelve-year-old.",
    "What is Newton's first law?",
]


def run(llama: object, params: GenerationParams, seeds: int) -> dict[str, float]:
    repeats: list[int] = []
    tokens: list[int] = []
    capped = 0
    for question in QUESTIONS:
        for seed in range(seeds):
            out = llama.create_chat_completion(  # type: ignore[attr-defined]
                messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
                **sampling_arguments(params),
                seed=seed,
            )
            choice = out["choices"][0]
            repeats.append(most_repeated(choice["message"]["content"]))
            tokens.append(out["usage"]["completion_tokens"])
            capped += choice["finish_reason"] == "length"
    return {
        "worst repeat": max(repeats),
        "mean repeat": statistics.fmean(repeats),
        "answers with a sentence 3+ times": sum(r >= 3 for r in repeats),
        "median tokens": statistics.median(tokens),
        "hit the cap": capped,
        "answers": len(repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from llama_cpp import Llama

    llama = Llama(
        model_path=str(default_model_path()), n_ctx=2048, n_threads=args.threads, verbose=False
    )
    defaults = LlamaCppEngine.default_generation
    neutral = GenerationParams(max_tokens=args.max_tokens, temperature=0.7)
    settings = {
        "baseline: no penalties, T 0.7": neutral,
        "repeat 1.1": replace(neutral, repeat_penalty=1.1),
        "repeat 1.2": replace(neutral, repeat_penalty=1.2),
        "frequency 0.5, presence 0.3": replace(
            neutral, frequency_penalty=0.5, presence_penalty=0.3
        ),
        "engine default (capped as shipped)": defaults,
        "engine default at this cap": replace(defaults, max_tokens=args.max_tokens),
    }
    print(f"{len(QUESTIONS)} questions x {args.seeds} seeds; cap {args.max_tokens} tokens")
    print(f"engine default: {defaults}")
    for name, params in settings.items():
        figures = run(llama, params, args.seeds)
        shown = ", ".join(
            f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
            for key, value in figures.items()
        )
        print(f"{name:40} {shown}", flush=True)


if __name__ == "__main__":
    main()
