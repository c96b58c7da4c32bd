"""The OpenAI-compatible API measured by an outside tool (NVIDIA aiperf), beside chatsite's records.

A benchmark written by the project can only agree with itself. This one points a tool the
serving world uses, ``aiperf``, at chatsite's ``POST /v1/chat/completions`` (streamed, usage
included) and joins what it measured, request by request, with what the server recorded of the
same requests (``StreamRecord``, ``path="api"``): aiperf sends an ``X-Request-ID`` per request,
and the server keeps it as the record's ``request_id``.

The tool lives in a venv of its own (created once, by default ``var/bench-tools/aiperf-0.13.0``,
with the project's Python); nothing of it is imported here, it is only run. aiperf needs a
tokenizer to size its prompts and the hub is not reachable, so one is built once from the model's
GGUF (``benchmarks/gguf_tokenizer.py``, run with the tool's Python) and kept beside the venv.

Each run starts Daphne with chatsite on loopback (``assistant.benchmarking.servers``), a fresh
SQLite database and one API key, then runs aiperf once per concurrency level, each under a
hard timeout, and prints per level aiperf's TTFT, ITL, latency and throughput beside the
server's own timings and ``aiperf TTFT - server TTFT`` per request (the wire and the client).

Usage: python benchmarks/openai_tools.py [--engine scripted|llamacpp] [--concurrency 1 4]
       [--requests 20] [--isl 32] [--osl 20] [--json summary.json]
Client and server share the machine's cores, as in a single-host deployment.
"""

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assistant.benchmarking.servers import (  # noqa: E402
    BENCHMARK_ENV,
    LiveServer,
    database_env,
    start_daphne,
)
from benchmarks.aiperf_results import level_summary, profile_lines, table  # noqa: E402

#: The tool and the one package the tokenizer needs beyond it (tokenizers and transformers come
#: with aiperf). A change here makes a fresh venv.
TOOL_REQUIREMENTS = ("aiperf==0.13.0", "gguf==0.19.0")
TOOL_DIR = ROOT / "var" / "bench-tools" / "aiperf-0.13.0"
#: What the tool's venv was made with; rebuilt when it differs.
TOOL_MARKER = "chatsite-requirements.txt"
#: The tool's own settings that would break it here: offline mode refuses a local tokenizer path.
TOOL_ENV_DROPPED = ("PYTHONPATH", "PYTHONHOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
#: Every record of an answer through the API, as JSON on standard output.
RECORDS_DUMP = (
    "import json; from assistant.models import StreamRecord; "
    "print(json.dumps(list(StreamRecord.objects.filter(path='api').values("
    "'request_id', 'outcome', 'tokens', 'server_ttft_ms', 'engine_ttft_ms', 'itl_mean_ms', "
    "'e2e_ms')), default=str))"
)


def tool_venv(path: Path) -> Path:
    """The tool's venv at ``path``, created (minutes, ~1.2 GB) unless already made with
    ``TOOL_REQUIREMENTS``; its Python."""
    python = path / "bin" / "python"
    marker = path / TOOL_MARKER
    wanted = "\n".join(TOOL_REQUIREMENTS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"creating {path} with {' '.join(TOOL_REQUIREMENTS)} (a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *TOOL_REQUIREMENTS,
        ],
        check=True,
        timeout=1800,
    )
    marker.write_text(wanted)
    return python


def tokenizer_dir(python: Path, gguf: Path, cache: Path) -> Path:
    """A tokenizer directory built from ``gguf`` (once; kept under ``cache``)."""
    out = cache / f"tokenizer-{gguf.stem}"
    if (out / "tokenizer.json").exists():
        return out
    building = Path(tempfile.mkdtemp(prefix="tokenizer-", dir=cache))
    subprocess.run(
        [str(python), str(ROOT / "benchmarks" / "gguf_tokenizer.py"), str(gguf), str(building)],
        check=True,
        timeout=300,
        env=tool_env(python.parent.parent),
    )
    building.rename(out)
    return out


def tool_env(venv: Path) -> dict[str, str]:
    """The environment the tool runs in: this one, in the tool's venv instead of the project's."""
    env = {k: v for k, v in os.environ.items() if k not in TOOL_ENV_DROPPED}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def manage(env: dict[str, str], *args: str) -> str:
    """``manage.py ARGS`` against the benchmark's database; its standard output."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stderr}")
    return done.stdout


def records_read(env: dict[str, str], wanted: set[str], wait: float = 10) -> dict[str, Any]:
    """The server's API records by request id, once those of ``wanted`` are all there (each is
    written when its answer has ended) or ``wait`` seconds have passed."""
    deadline = time.monotonic() + wait
    while True:
        rows = json.loads(manage(env, "shell", "-c", RECORDS_DUMP).splitlines()[-1])
        records = {row["request_id"]: row for row in rows}
        if wanted <= records.keys() or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User + system CPU time of every child this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def server_pids(server: LiveServer) -> list[int]:
    """Daphne, and the model process (supervisor and runner) when it has one."""
    pids = [server.process.pid]
    if server.model_host is not None:
        pids += [server.model_host.process.pid, int(server.model_host.status().pid)]
    return pids


def aiperf_run(
    venv: Path, command: list[str], log: Path, timeout: float
) -> tuple[int, float, float]:
    """Run aiperf in a session of its own (its workers are processes) and kill the whole
    session past ``timeout`` seconds. (exit status, wall seconds, CPU seconds of the tool)."""
    cpu_before, started = children_cpu_seconds(), time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env=tool_env(venv),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            status = -1
    return status, time.monotonic() - started, children_cpu_seconds() - cpu_before


def key_hidden(text: str, key: str) -> str:
    return "KEY" if text == key else text


def server_env(args: argparse.Namespace) -> dict[str, str]:
    env = {**BENCHMARK_ENV, "CHATSITE_ENGINE": args.engine}
    if args.engine == "scripted":
        env |= {
            "CHATSITE_SCRIPTED_TTFT_MS": str(args.ttft_ms),
            "CHATSITE_SCRIPTED_ITL_MS": str(args.itl_ms),
            "CHATSITE_SCRIPTED_TOKENS": str(args.tokens),
        }
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["scripted", "llamacpp"], default="scripted")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=20, help="measured requests per level")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured requests per level")
    parser.add_argument("--isl", type=int, default=32, help="prompt tokens (no spread)")
    parser.add_argument("--osl", type=int, default=20, help="max_completion_tokens asked")
    parser.add_argument("--ttft-ms", type=int, default=50, help="scripted engine")
    parser.add_argument("--itl-ms", type=int, default=10, help="scripted engine")
    parser.add_argument("--tokens", type=int, default=20, help="scripted engine")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per aiperf run")
    parser.add_argument("--tool-dir", type=Path, default=TOOL_DIR, help="the tool's venv")
    parser.add_argument("--gguf", type=Path, help="tokenizer source; default: the model's GGUF")
    parser.add_argument("--artifacts", type=Path, help="keep aiperf's files here")
    parser.add_argument("--json", type=Path, help="write the summary to this file")
    args = parser.parse_args()

    from assistant.engines.llamacpp import default_model_path

    gguf = args.gguf or Path(os.environ.get("CHATSITE_LLAMACPP_MODEL_PATH") or default_model_path())
    python = tool_venv(args.tool_dir.resolve())
    tokenizer = tokenizer_dir(python, gguf, args.tool_dir.resolve().parent)
    print(f"tool: {python.parent.parent}; tokenizer: {tokenizer}", flush=True)
    venv = python.parent.parent
    levels: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="openai-tools-") as tmp:
        work = Path(tmp)
        artifacts = (args.artifacts or work / "aiperf").resolve()
        db = str(work / "bench.sqlite3")
        db_env = {**database_env(db), "CHATSITE_ENGINE": "scripted"}
        manage(db_env, "migrate", "-v0")
        key = manage(db_env, "apikey", "create", "aiperf", "--rate", "1000000").strip()
        server = start_daphne(workdir=work, db_path=db, env=server_env(args))
        try:
            commands: dict[int, list[str]] = {}
            for concurrency in args.concurrency:
                out = artifacts / f"concurrency_{concurrency}"
                out.mkdir(parents=True, exist_ok=True)
                command = [
                    str(venv / "bin" / "aiperf"), "profile", "--model", "chatsite",
                    "--tokenizer", str(tokenizer), "--url", server.url, "--api-key", key,
                    "--endpoint-type", "chat", "--streaming",
                    "--concurrency", str(concurrency), "--request-count", str(args.requests),
                    "--warmup-request-count", str(args.warmup),
                    "--isl", str(args.isl), "--isl-stddev", "0", "--osl", str(args.osl),
                    "--use-server-token-count", "--ui", "none", "--no-server-metrics",
                    "--no-gpu-telemetry", "--random-seed", "1", "--artifact-dir", str(out),
                ]  # fmt: skip
                commands[concurrency] = command
                pids = server_pids(server)
                before = sum(cpu_seconds(pid) for pid in pids)
                status, wall, tool_cpu = aiperf_run(venv, command, out / "aiperf.log", args.timeout)
                server_cpu = sum(cpu_seconds(pid) for pid in pids) - before
                lines = profile_lines(out)
                if status != 0 or not lines:
                    tail = (out / "aiperf.log").read_text(errors="replace")[-3000:]
                    print(f"c={concurrency}: aiperf exited {status} after {wall:.0f} s:\n{tail}")
                aggregate_file = out / "profile_export_aiperf.json"
                aggregate = (
                    json.loads(aggregate_file.read_text()) if aggregate_file.exists() else {}
                )
                levels.append(
                    {
                        "lines": lines,
                        "aggregate": aggregate,
                        "concurrency": concurrency,
                        "tool_status": status,
                        "tool_wall_s": round(wall, 1),
                        "tool_cpu_s": round(tool_cpu, 1),
                        "server_cpu_ms_per_answer": (
                            round(server_cpu * 1000 / (len(lines) + args.warmup), 1)
                            if lines
                            else None
                        ),
                    }
                )
            sent = {line["metadata"]["x_request_id"] for lv in levels for line in lv["lines"]}
            records = records_read(db_env, sent)
        finally:
            server.stop()
        if args.artifacts is None:
            shutil.rmtree(artifacts, ignore_errors=True)
    summaries = []
    for level in levels:
        lines, aggregate = level.pop("lines"), level.pop("aggregate")
        summaries.append(
            {**level_summary(level["concurrency"], aggregate, lines, records), **level}
        )
    engine = (
        f"scripted (TTFT {args.ttft_ms} ms, ITL {args.itl_ms} ms, {args.tokens} tokens)"
        if args.engine == "scripted"
        else f"llamacpp ({gguf.name})"
    )
    print(
        f"\naiperf {TOOL_REQUIREMENTS[0].split('==')[1]} -> POST /v1/chat/completions "
        f"(streamed), engine {engine}, {args.requests} requests per level, ISL {args.isl}, "
        f"OSL {args.osl}, {os.cpu_count()} CPUs shared by client and server\n"
    )
    print(table(summaries))
    if args.json:
        plan = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(
            json.dumps(
                {
                    "plan": plan,
                    "engine": engine,
                    "cpus": os.cpu_count(),
                    "tool": TOOL_REQUIREMENTS[0],
                    "levels": summaries,
                    "commands": {
                        str(c): [key_hidden(a, key) for a in cmd] for c, cmd in commands.items()
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
