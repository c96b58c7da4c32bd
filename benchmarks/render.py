"""What rendering an answer costs the browser: the page's main-thread time per token over a long
markdown answer, and time to first token as the page measures it (its beacon), for this checkout
and a baseline checkout side by side, in headless Chromium against Daphne on loopback.

    python benchmarks/render.py [--tokens 2000] [--questions 30] [--rounds 3]
        [--baseline-root DIR]

The answer is a markdown document (headings, paragraphs, lists, Python code, a table) cut into
word tokens, sent by the scripted engine ``--itl-ms`` apart. Main-thread time is Chromium's own
``TaskDuration`` (script, style, layout, paint) from the DevTools protocol, read before the
answer, once half of it is on screen, and when it is done: the cost per token of the first and
of the second half says whether it grows with the answer. ``--baseline-root`` is another checkout
(``git archive <rev> | tar -x -C DIR``), run the same way; rounds alternate between the two.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, CDPSession, Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistant.benchmarking.servers import (  # noqa: E402
    BENCHMARK_ENV,
    CHROMIUM_ARGS,
    LiveServer,
    chromium_executable,
    start_daphne,
)
from assistant.benchmarking.stats import percentile  # noqa: E402

SECTION = """## Step {n}: what the plant does

Plants capture light with **chlorophyll** in their leaves. The light splits water, and the
energy builds glucose from carbon dioxide; oxygen is what is left over. This is why a plant in
the dark slowly uses up its sugar instead of making more.

- light is absorbed by chlorophyll
- water is split, giving oxygen
- carbon dioxide is fixed into sugar
- the sugar feeds the whole plant

```python
def glucose_made(light_hours: float, leaf_area_m2: float) -> float:
    rate = 1.2  # grams per square metre per hour
    return rate * light_hours * leaf_area_m2

print(glucose_made(8, 0.5))
```

| input | output |
|---|---|
| 6 CO2 + 6 H2O | C6H12O6 + 6 O2 |

"""


def markdown_tokens(count: int) -> list[str]:
    """``count`` word tokens of a markdown document (whitespace stays with the word before)."""
    tokens: list[str] = []
    n = 1
    while len(tokens) < count:
        tokens += re.findall(r"\S+\s*|\s+", SECTION.format(n=n))
        n += 1
    return tokens[:count]


def serve(root: Path, workdir: Path, name: str, max_chars: int) -> LiveServer:
    db = workdir / f"{name}.sqlite3"
    env = {**os.environ, "CHATSITE_ENGINE": "scripted", "CHATSITE_SQLITE_PATH": str(db)}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=root, env=env, check=True)
    return start_daphne(
        workdir=workdir,
        root=root,
        db_path=str(db),
        env={
            **BENCHMARK_ENV,
            # The long answer travels in the question (text=...), so both checkouts send the
            # same tokens whatever their scripted engine knows.
            "CHATSITE_MAX_MESSAGE_CHARS": str(max_chars),
            "CHATSITE_MAX_BODY_BYTES": str(4 * max_chars),
            "CHATSITE_MAX_TOKENS": "100000",
        },
    )


def open_page(browser: Browser, server: LiveServer) -> Page:
    context = browser.new_context(base_url=server.url, viewport={"width": 1100, "height": 800})
    page = context.new_page()
    page.goto("/")
    page.wait_for_selector("body[data-ready='1']", state="attached")
    return page


LAST_ANSWER = "#messages .message.assistant:last-of-type"


def ask(page: Page, question: str) -> dict[str, Any]:
    """Ask, wait for the answer to finish, and return the page's beacon for it."""
    with page.expect_request(lambda r: r.url.endswith("/api/chat/beacon")) as beacon:
        page.locator("#prompt").fill(question)
        page.locator("#prompt").press("Enter")
        page.wait_for_function(
            "(s) => { const a = document.querySelector(s);"
            " return a && !a.classList.contains('streaming'); }",
            arg=LAST_ANSWER,
            timeout=120_000,
        )
    return json.loads(beacon.value.post_data or "{}")


def task_ms(session: CDPSession) -> float:
    """The page's main-thread time so far (ms), since the session enabled the counters."""
    return main_thread(session)["TaskDuration"]


def main_thread(session: CDPSession) -> dict[str, float]:
    """Chromium's main-thread counters (ms): all tasks, script, style, layout."""
    metrics = {m["name"]: m["value"] for m in session.send("Performance.getMetrics")["metrics"]}
    names = ["TaskDuration", "ScriptDuration", "RecalcStyleDuration", "LayoutDuration"]
    return {name: metrics[name] * 1000 for name in names}


def long_answer(page: Page, tokens: list[str], itl_ms: int) -> dict[str, float]:
    """Main-thread ms per token over the first and the second half of a long answer."""
    session = page.context.new_cdp_session(page)
    session.send("Performance.enable")
    text = json.dumps(tokens).replace("'", "\\u0027")
    half_chars = len("".join(tokens[: len(tokens) // 2]))
    page.evaluate("() => document.getElementById('new-chat').click()")
    start = task_ms(session)
    before = main_thread(session)
    page.locator("#prompt").fill(f"[scripted ttft_ms=50 itl_ms={itl_ms} text='{text}'] Explain.")
    page.locator("#prompt").press("Enter")
    page.wait_for_function(
        "([s, n]) => { const b = document.querySelector(s + ' .body');"
        " return b && b.textContent.length >= n; }",
        arg=[LAST_ANSWER, int(half_chars * 0.9)],
        polling=100,
        timeout=120_000,
    )
    middle = task_ms(session)
    shown = page.evaluate(f"() => document.querySelector('{LAST_ANSWER} .body').textContent.length")
    page.wait_for_function(
        "(s) => !document.querySelector(s).classList.contains('streaming')",
        arg=LAST_ANSWER,
        polling=100,
        timeout=120_000,
    )
    end = task_ms(session)
    after = main_thread(session)
    session.detach()
    total_chars = len("".join(tokens))
    first = max(1, round(len(tokens) * shown / total_chars))
    return {
        "first_half_ms_per_token": (middle - start) / first,
        "second_half_ms_per_token": (end - middle) / max(1, len(tokens) - first),
        "total_ms": end - start,
        **{f"{name}_ms": after[name] - before[name] for name in after},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--itl-ms", type=int, default=5)
    parser.add_argument("--questions", type=int, default=30, help="short answers for TTFT")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-root", type=Path, help="another checkout to compare with")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    tokens = markdown_tokens(args.tokens)
    max_chars = len(json.dumps(tokens)) + 1000
    roots = {"this checkout": ROOT}
    if args.baseline_root:
        roots = {"baseline": args.baseline_root.resolve(), **roots}
    results: dict[str, dict[str, list[float]]] = {
        name: {
            "ttft": [],
            "first": [],
            "second": [],
            "total": [],
            "script": [],
            "style": [],
            "layout": [],
        }
        for name in roots
    }
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_executable(), headless=True, args=CHROMIUM_ARGS
        )
        servers = {
            name: serve(root, Path(tmp), name.replace(" ", "-"), max_chars)
            for name, root in roots.items()
        }
        try:
            for round_ in range(args.rounds):
                for name, server in servers.items():
                    page = open_page(browser, server)
                    figures = results[name]
                    for _ in range(args.questions // args.rounds):
                        beacon = ask(page, "[scripted tokens=5 ttft_ms=50 itl_ms=10] Quick one.")
                        if beacon.get("ttft_ms") is not None:
                            figures["ttft"].append(beacon["ttft_ms"])
                    cost = long_answer(page, tokens, args.itl_ms)
                    figures["first"].append(cost["first_half_ms_per_token"])
                    figures["second"].append(cost["second_half_ms_per_token"])
                    figures["total"].append(cost["total_ms"])
                    figures["script"].append(cost["ScriptDuration_ms"])
                    figures["style"].append(cost["RecalcStyleDuration_ms"])
                    figures["layout"].append(cost["LayoutDuration_ms"])
                    page.context.close()
                    print(f"round {round_ + 1}: {name} done", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
            browser.close()

    def median(values: list[float]) -> float:
        return percentile(sorted(values), 50) if values else float("nan")

    print(
        f"\n{args.tokens}-token markdown answer, tokens {args.itl_ms} ms apart;"
        f" TTFT over {args.questions} short answers (scripted engine 50 ms to its first token)\n"
    )
    header = (
        f"{'':16} {'TTFT P50':>9} {'TTFT P95':>9} {'ms/token 1st half':>18}"
        f" {'ms/token 2nd half':>18} {'main thread, whole answer':>26}"
    )
    print(header)
    rows = {}
    for name, figures in results.items():
        ttft = sorted(figures["ttft"])
        row = {
            "ttft_p50_ms": percentile(ttft, 50),
            "ttft_p95_ms": percentile(ttft, 95),
            "first_half_ms_per_token": median(figures["first"]),
            "second_half_ms_per_token": median(figures["second"]),
            "total_ms": median(figures["total"]),
            "script_ms": median(figures["script"]),
            "style_ms": median(figures["style"]),
            "layout_ms": median(figures["layout"]),
        }
        rows[name] = row
        print(
            f"{name:16} {row['ttft_p50_ms']:9.1f} {row['ttft_p95_ms']:9.1f}"
            f" {row['first_half_ms_per_token']:18.3f} {row['second_half_ms_per_token']:18.3f}"
            f" {row['total_ms']:23.0f} ms"
            f"  (script {row['script_ms']:.0f}, style {row['style_ms']:.0f},"
            f" layout {row['layout_ms']:.0f})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
