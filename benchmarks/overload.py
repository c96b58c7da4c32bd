"""Overload: bursts far above what the site serves at once, through nginx, and what each is told.

deploy/loopback_stack as shipped (nginx, ``--workers`` workers, Daphne's or with ``--server
uvicorn`` uvicorn's, PostgreSQL and Redis), the workers on the scripted engine (100 ms to the
first token, then 20 tokens 50 ms apart), every limit at its default. Two bursts, each at one
moment:

1. ``--visits`` first visits: new browsers loading the page;
2. ``--questions`` questions: students whose page is loaded (loaded beforehand, 50 at a time)
   asking together.

Students sit 60 to an address, as classes behind their schools' NATs. Every answer is sorted
(assistant/benchmarking/overload.py): served, refused the right way (503 or 429 with
Retry-After, as JSON or, to a navigation, the busy page), stopped (an answer begun, then given up
for another class's fair share of the engine), or wrong (502, 504, 500, a reset, no answer in
time). Then each refused student does what the page does, waits as told and tries again (and
each stopped one presses Retry a second later), until served or ``--cap-s``; the table gives
how long the last one waited.

    python benchmarks/overload.py [--visits 1000] [--questions 1000] [--workers 2]

nginx gets ``worker_connections`` of three per student (each stream holds two), as
docs/deploy.md sizes it; the load generator's CPU is reported beside the servers'.
"""

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from load import (  # noqa: E402
    QUESTIONS,
    Meter,
    class_address,
    log_sizes,
    logged_since,
    markdown,
    raise_open_files,
    wait_for_quiet,
)

from assistant.benchmarking import percentile  # noqa: E402
from assistant.benchmarking.client import Student  # noqa: E402
from assistant.benchmarking.overload import (  # noqa: E402
    Answer,
    answer_counts,
    ask_until_served,
    visit_until_served,
)
from deploy.loopback_stack import (  # noqa: E402
    WORKER_CONNECTIONS,
    LoopbackStack,
    add_server_option,
)

ENGINE = {
    "CHATSITE_SCRIPTED_TTFT_MS": "100",
    "CHATSITE_SCRIPTED_ITL_MS": "50",
    "CHATSITE_SCRIPTED_TOKENS": "20",
}


async def visits_until_served(url: str, count: int, cap_s: float) -> list[list[Answer]]:
    """``count`` new browsers loading the page at once; each refused one loads it again after
    the Retry-After it was given (as the busy page does), until served or ``cap_s``. Each
    browser's answers in order."""
    deadline = time.perf_counter() + cap_s
    browsers = (
        visit_until_served(url, source=class_address(n), deadline=deadline) for n in range(count)
    )
    return await asyncio.gather(*browsers)


async def questions_until_served(url: str, count: int, cap_s: float) -> list[list[Answer]]:
    """``count`` students load the page (50 at a time, waiting out refusals), then all ask at
    once; each refused one asks again after its Retry-After. Each student's answers in order."""
    students = [Student(base_url=url, source=class_address(n), timeout=60) for n in range(count)]
    pages = asyncio.Semaphore(50)

    async def load(student: Student) -> None:
        for _ in range(30):
            async with pages:
                response = await student.client.get(student.page_url)
            if response.status_code == 200:
                return
            await asyncio.sleep(float(response.headers.get("retry-after", "2")))
        raise RuntimeError(f"the page was refused 30 times: {response.status_code}")

    try:
        await asyncio.gather(*(load(s) for s in students))
        start = asyncio.Event()
        deadline = time.perf_counter() + cap_s

        async def student_asks(number: int) -> list[Answer]:
            await start.wait()
            return await ask_until_served(
                students[number], QUESTIONS[number % len(QUESTIONS)], deadline=deadline
            )

        tasks = [asyncio.ensure_future(student_asks(n)) for n in range(count)]
        await asyncio.sleep(0.5)  # every task waits at the start line
        start.set()
        return await asyncio.gather(*tasks)
    finally:
        await asyncio.gather(*(s.aclose() for s in students))


def burst_row(label: str, runs: list[list[Answer]], cpu: dict[str, Any]) -> dict[str, Any]:
    first = [answers[0] for answers in runs]
    last = [answers[-1] for answers in runs]
    waited = [
        sum(a.ms for a in answers) / 1000 + sum(a.wait_s or 0 for a in answers[:-1])
        for answers in runs
        if answers[-1].kind == "served"
    ]
    return {
        "burst": label,
        "at_once": len(runs),
        "first_answers": answer_counts(first),
        "wrong_any_try": answer_counts([a for answers in runs for a in answers])["wrong"],
        "served_in_the_end": sum(a.kind == "served" for a in last),
        "tries_max": max(len(answers) for answers in runs),
        "served_after_s": [
            round(percentile(waited, q), 1) if waited else None for q in (50, 99, 100)
        ],
        "cpu": cpu,
    }


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def table(rows: list[dict[str, Any]]) -> str:
    header = [
        "burst",
        "at once",
        "served at once",
        "refused right (first answer)",
        "stopped (first answer)",
        "wrong (any try)",
        "served in the end",
        "tries (most)",
        "served after P50 / P99 / max",
        "CPU: workers / nginx / client",
    ]
    body = []
    for row in rows:
        first, cpu = row["first_answers"], row["cpu"]
        body.append(
            [
                row["burst"],
                f"{row['at_once']:,}",
                f"{sum(first['served'].values()):,}",
                _counts(first["refused"]),
                _counts(first["stopped"]),
                _counts(row["wrong_any_try"]),
                f"{row['served_in_the_end']:,}",
                str(row["tries_max"]),
                " / ".join("-" if v is None else f"{v:.1f}" for v in row["served_after_s"]) + " s",
                f"{cpu.get('workers', 0):.1f} / {cpu.get('nginx', 0):.1f} / "
                f"{cpu.get('client', 0):.1f} s",
            ]
        )
    return markdown(header, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--visits", type=int, default=1000, help="first visits at once")
    parser.add_argument("--questions", type=int, default=1000, help="questions at once")
    parser.add_argument("--workers", type=int, default=2, help="workers behind nginx")
    add_server_option(parser)
    parser.add_argument("--cap-s", type=float, default=180, help="for the refused to be served")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the workers")
    parser.add_argument("--max-wait-s", type=float, default=1800)
    parser.add_argument("--idle-wait-s", type=float, default=300)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    print(f"open files: {raise_open_files()}", file=sys.stderr)
    largest = max(args.visits, args.questions)
    env = {**ENGINE, **dict(item.split("=", 1) for item in args.env)}
    rows = []
    wait_for_quiet(args.max_wait_s, args.idle_wait_s)
    with (
        tempfile.TemporaryDirectory(prefix="chatsite-overload-") as tmp,
        LoopbackStack(
            Path(tmp) / "stack",
            workers=args.workers,
            server=args.server,
            env=env,
            worker_connections=max(WORKER_CONNECTIONS, 3 * largest),
        ) as stack,
    ):
        assert stack.state is not None
        roles = {
            p.pid: "nginx" if name == "nginx" else "workers"
            for name, p in stack.state.processes.items()
        }
        url = stack.url
        asyncio.run(questions_until_served(url, 10, 60))  # warm: imports, pools; not recorded
        sizes = log_sizes(stack.work)
        for label, count, burst in (
            ("first visits", args.visits, visits_until_served),
            ("questions", args.questions, questions_until_served),
        ):
            if not count:
                continue
            meter = Meter(roles, stack.name)
            meter.start()
            runs = asyncio.run(
                burst(url + ("/" if burst is visits_until_served else ""), count, args.cap_s)
            )
            rows.append(burst_row(label, runs, meter.stop()))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
            time.sleep(5)
        logged = logged_since(sizes)
    print(table(rows) + "\n\nLogged: " + _counts(logged) + "\n", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args), "rows": rows, "logged": logged}, indent=2, default=str)
            + "\n"
        )


if __name__ == "__main__":
    main()
