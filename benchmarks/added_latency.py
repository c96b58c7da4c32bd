"""Added first-token latency: what the serving stack adds on top of the engine's own TTFT.

Each request opens a new connection, POSTs a question and waits for the first ``event: token``.
The engine is the scripted one with a fixed first-token delay, so

    added = (client sees first token - client sent request) - engine first-token delay.

The same client measures three servers on loopback, one at a time:

* ``bare``: a minimal asyncio HTTP server that sleeps the same delay and writes the same frames
  (the floor: no framework at all);
* ``uvicorn``: uvicorn + sse-starlette, a common Python streaming stack;
* ``chatsite``: Daphne + chatsite's ``direct`` path (the Channels consumer, through the split
  router) with the scripted engine (CSRF, session, SQLite);
* ``daphne-raw`` and ``uvicorn-raw``: each server running a raw ASGI application that writes
  the same frames (assistant/benchmarking/raw_app.py): the server's own floor. Measured beside
  ``chatsite`` and ``chatsite-uvicorn`` (the same application under uvicorn[standard]), the run
  ends with chatsite's CPU per answer as a multiple of its server's floor.
* ``chatsite-django``: the same server, ``django`` path (an async view behind the middleware).
* ``chatsite-class``: ``chatsite`` for a student who joined a class (its persona and settings
  read with the session on every question).
* ``chatsite-api``: the same server's OpenAI-compatible API (``POST /v1/chat/completions``,
  streamed, a key in the ``Authorization`` header); its first token is the first chunk with
  content.

Beside each figure: the server process's CPU time per answer over the measured run (user +
system, from ``/proc/<pid>/stat``).

Usage: python benchmarks/added_latency.py [--requests 200] [--concurrency 1 50] [--ttft-ms 100]
       [--servers ...] [--chatsite-root DIR] [--profile DIR] [--profiler py-spy|perf]
``--profile DIR`` also samples each server during each measured run with py-spy (``pip install
-e ".[bench]"``; 1,000 samples a second of the thread holding the GIL, without pausing the
server), or with Linux's perf (``--profiler perf``: every thread, only while on a CPU;
assistant/benchmarking/sampling.py), writes its raw stacks to DIR and prints the top of each
profile (assistant/benchmarking/profile.py). The sampling costs the machine some CPU: take the
latency and CPU figures from a run without it.
``--chatsite-root`` runs the chatsite servers from another checkout of the project (its own
code, this client), so two versions are measured the same way: alternate the two in one
session to compare them. Client and servers share the machine's cores, as in a single-host
deployment.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from assistant.benchmarking import SSEParser, percentile  # noqa: E402
from assistant.benchmarking.ports import accepts, free_port  # noqa: E402
from assistant.benchmarking.sampling import (  # noqa: E402
    PERF_ENV,
    PROFILERS,
    sampler_show,
    sampler_start,
)
from assistant.benchmarking.servers import BENCHMARK_ENV, LiveServer, start_daphne  # noqa: E402
from assistant.modelhost.supervisor import die_with_parent  # noqa: E402

BARE_SERVER = r"""
import asyncio, sys
from assistant.sse import encode_comment, encode_json_event
TTFT, TOKENS, ITL = float(sys.argv[2]) / 1000, int(sys.argv[3]), float(sys.argv[4]) / 1000
async def handle(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n")
                   if l.lower().startswith(b"content-length")), 0)
    await reader.readexactly(length)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n" + encode_comment("open"))
    await asyncio.sleep(TTFT)
    for i in range(TOKENS):
        if i:
            await asyncio.sleep(ITL)
        writer.write(encode_json_event({"text": f" t{i}"}, event="token", id=str(i + 1)))
        await writer.drain()
    writer.write(encode_json_event({"finish_reason": "stop"}, event="done"))
    await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""

UVICORN_SERVER = r"""
import asyncio, sys
import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.routing import Route
TTFT, TOKENS, ITL = float(sys.argv[2]) / 1000, int(sys.argv[3]), float(sys.argv[4]) / 1000
async def stream(request):
    await request.body()
    async def events():
        await asyncio.sleep(TTFT)
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(ITL)
            yield {"event": "token", "id": str(i + 1), "data": '{"text":" t%d"}' % i}
        yield {"event": "done", "data": '{"finish_reason":"stop"}'}
    return EventSourceResponse(events())
app = Starlette(routes=[Route("/api/chat/stream", stream, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


async def body_pieces(reader: asyncio.StreamReader, head: bytes) -> AsyncIterator[bytes]:
    """The response body after ``head``, piece by piece as it arrives: de-chunked when the
    server chunks it (Daphne and uvicorn do), else read until the server closes (the bare one)."""
    fields = (line.partition(b":") for line in head.lower().split(b"\r\n")[1:])
    headers = {name.strip(): value.strip() for name, _, value in fields}
    if headers.get(b"transfer-encoding") != b"chunked":
        while data := await reader.read(65536):
            yield data
        return
    while size := int((await reader.readline()).split(b";")[0], 16):
        yield (await reader.readexactly(size + 2))[:-2]


async def one_request(port: int, request: bytes) -> float:
    """Seconds from sending the request to reading the first token frame (its terminating
    blank line). Reads the whole answer, as a browser does, so that every stream occupies the
    server for its full length."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        sent = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        parser = SSEParser()
        first_token = None
        done = False
        start = b""  # of the body, for the error
        async for data in body_pieces(reader, head):
            start += data[: 300 - len(start)]
            for event in parser.feed(data):
                if first_token is None and is_token(event.event, event.data):
                    first_token = time.perf_counter() - sent
                done = done or event.event == "done" or event.data == "[DONE]"
        if first_token is None or not done:
            raise ConnectionError(f"incomplete answer: {head + start!r}")
        return first_token
    finally:
        writer.close()


def is_token(event: str, data: str) -> bool:
    """A token: the page's ``token`` event, or an OpenAI chunk with content (not the one that
    carries only the role)."""
    return event == "token" or ('"content":"' in data and '"content":""' not in data)


async def run_load(port: int, request: bytes, total: int, concurrency: int) -> list[float]:
    samples: list[float] = []
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            samples.append(await one_request(port, request))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def build_request(
    port: int,
    body: bytes,
    cookies: str = "",
    token: str = "",
    path: str = "/api/chat/stream",
    key: str = "",
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if cookies:
        lines.append(f"Cookie: {cookies}")
    if token:  # a browser's question: its page's origin too, as a fetch sends it
        lines += [f"X-CSRFToken: {token}", f"Origin: http://127.0.0.1:{port}"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def wait_port(port: int, timeout: float = 30) -> None:

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if accepts(port, timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


#: The raw ASGI application (assistant/benchmarking/raw_app.py) under each server: its floor.
RAW_APP = "assistant.benchmarking.raw_app:application"
#: ``daphne-raw`` is Daphne as chatsite runs it (chatsite/server.py: its event loop, drain and
#: checks), so that the difference is chatsite's application alone.
RAW_SERVERS = {
    "daphne-raw": ["chatsite.server", "-b", "127.0.0.1", "-p"],
    "uvicorn-raw": ["uvicorn", "--no-access-log", "--host", "127.0.0.1", "--port"],
}
#: Which floor each chatsite server is measured against (``--servers`` prints the ratio).
FLOORS = {"chatsite": "daphne-raw", "chatsite-uvicorn": "uvicorn-raw"}


def peer_start(
    name: str,
    ttft_ms: float,
    tokens: int,
    itl_ms: float,
    env: dict[str, str] | None = None,
    *,
    root: Path = ROOT,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``bare``, ``uvicorn`` or a raw server on a free port and wait until it accepts;
    ``env``: more environment for it; ``root``: the checkout whose code it runs."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": str(root)}
    out = None
    if name in RAW_SERVERS:
        pace = {"RAW_TTFT_MS": str(ttft_ms), "RAW_TOKENS": str(tokens), "RAW_ITL_MS": str(itl_ms)}
        command = [sys.executable, "-m", *RAW_SERVERS[name], str(port), RAW_APP]
        full_env.update(pace, DJANGO_SETTINGS_MODULE="chatsite.settings", **BENCHMARK_ENV)
        out = subprocess.DEVNULL  # Daphne's access log, as chatsite's goes to its log file
    else:
        code = BARE_SERVER if name == "bare" else UVICORN_SERVER
        command = [sys.executable, "-c", code, str(port), str(ttft_ms), str(tokens), str(itl_ms)]
    process = subprocess.Popen(
        command,
        cwd=root,
        env={**full_env, **(env or {})},
        stdout=out,
        preexec_fn=die_with_parent,
    )
    try:
        wait_port(port)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, port


def database_migrate(root: Path, env: dict[str, str], db: Path) -> None:
    """Create chatsite's tables in the SQLite file ``db`` with the code of checkout ``root``."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=root,
        env={**env, "CHATSITE_ENGINE": "scripted", "CHATSITE_SQLITE_PATH": str(db)},
        check=True,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(name: str, concurrency: int, samples: list[float], ttft_ms: float, cpu_s: float) -> dict:
    added = [s * 1000 - ttft_ms for s in samples]
    row = {
        "server": name,
        "concurrency": concurrency,
        "requests": len(samples),
        "cpu_ms_per_answer": round(cpu_s * 1000 / len(samples), 2),
        "p50_ms": round(percentile(added, 50), 2),
        "p95_ms": round(percentile(added, 95), 2),
        "p99_ms": round(percentile(added, 99), 2),
    }
    print(
        f"{name:9s} c={concurrency:<3d} n={len(samples):<4d} added first-token latency: "
        f"p50 {row['p50_ms']:7.2f} ms   p95 {row['p95_ms']:7.2f} ms   p99 {row['p99_ms']:7.2f} ms"
        f"   server CPU {row['cpu_ms_per_answer']:6.2f} ms/answer",
        flush=True,
    )
    return row


CLASS_CREATE = (
    "from assistant.models import Classroom; "
    "from assistant.services.classrooms import join_code_new; "
    "print(Classroom.objects.create(name='Bench', join_code=join_code_new(), "
    "persona='You are a patient tutor.').join_code)"
)


def class_create(root: Path, env: dict[str, str]) -> str:
    """A class in the benchmark's database; its join code."""
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", CLASS_CREATE],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


KEY_CREATE = [sys.executable, "manage.py", "apikey", "create", "bench", "--rate", "100000000"]


def key_create(root: Path, env: dict[str, str]) -> str:
    """An API key in the benchmark's database (printed alone on stdout)."""
    done = subprocess.run(KEY_CREATE, cwd=root, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def page_request(
    name: str, server: LiveServer, root: Path, env: dict[str, str], db: Path
) -> tuple[int, bytes]:
    """The page's question as a browser sends it: session and CSRF cookies from a page load
    (and the class joined, for ``chatsite-class``)."""
    import httpx

    browser = httpx.Client(base_url=server.url)
    page = browser.get("/")
    if name == "chatsite-class":
        code = class_create(root, {**env, "CHATSITE_SQLITE_PATH": str(db)})
        token = browser.cookies["csrftoken"]
        browser.post("/c/", data={"code": code, "csrfmiddlewaretoken": token})
    cookies = "; ".join(f"{c.name}={c.value}" for c in browser.cookies.jar)
    browser.close()
    body = json.dumps({"message": "What is photosynthesis?"}).encode()
    path = "/api/chat/stream/django" if name == "chatsite-django" else "/api/chat/stream"
    token = page.cookies["csrftoken"]
    return server.port, build_request(server.port, body, cookies, token, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--ttft-ms", type=float, default=100)
    parser.add_argument("--tokens", type=int, default=20, help="tokens per answer")
    parser.add_argument("--itl-ms", type=float, default=20, help="engine gap between tokens")
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=[
            "bare",
            "uvicorn",
            "daphne-raw",
            "uvicorn-raw",
            "chatsite",
            "chatsite-uvicorn",
            "chatsite-django",
            "chatsite-class",
            "chatsite-api",
        ],
        default=["bare", "uvicorn", "chatsite", "chatsite-django"],
    )
    parser.add_argument(
        "--chatsite-root", type=Path, default=ROOT, help="run chatsite from this checkout"
    )
    parser.add_argument(
        "--streams-per-session",
        type=int,
        default=0,
        help="CHATSITE_STREAMS_PER_SESSION for chatsite (0: no cap, as measured before; every "
        "request is the same session's, so a cap above the concurrency costs slot bookkeeping "
        "and refuses nothing)",
    )
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--profile", type=Path, help="sample the servers, into DIR")
    parser.add_argument("--profiler", choices=PROFILERS, default="py-spy")
    args = parser.parse_args()
    if args.profile and args.profiler == "perf":
        os.environ.update(PERF_ENV)  # the servers' (set before any starts)

    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.servers:
            process = None
            if name.startswith("chatsite"):
                db = Path(tmp) / "bench.sqlite3"
                database_migrate(args.chatsite_root, env, db)
                server = start_daphne(
                    workdir=Path(tmp),
                    root=args.chatsite_root,
                    db_path=str(db),
                    uvicorn=name == "chatsite-uvicorn",
                    env={
                        **BENCHMARK_ENV,
                        "CHATSITE_SCRIPTED_TTFT_MS": str(int(args.ttft_ms)),
                        "CHATSITE_SCRIPTED_TOKENS": str(args.tokens),
                        "CHATSITE_SCRIPTED_ITL_MS": str(int(args.itl_ms)),
                        # Resuming off (no finished answer kept), as for the figures in
                        # docs/performance.md.
                        "CHATSITE_RESUME_GRACE_S": "0",
                        "CHATSITE_STREAMS_PER_SESSION": str(args.streams_per_session),
                    },
                )
                if name == "chatsite-api":
                    key = key_create(args.chatsite_root, {**env, "CHATSITE_SQLITE_PATH": str(db)})
                    question = {"role": "user", "content": "What is photosynthesis?"}
                    body = json.dumps(
                        {"model": "chatsite", "messages": [question], "stream": True}
                    ).encode()
                    port = server.port
                    request = build_request(port, body, path="/v1/chat/completions", key=key)
                else:
                    port, request = page_request(name, server, args.chatsite_root, env, db)
            else:
                process, port = peer_start(name, args.ttft_ms, args.tokens, args.itl_ms)
                request = build_request(port, b'{"message": "What is photosynthesis?"}')
            try:
                asyncio.run(run_load(port, request, 10, 1))  # warm up
                for concurrency in args.concurrency:
                    pid = (process or server.process).pid
                    label = f"{name}-c{concurrency}"
                    sampler = sampler_start(args.profile, pid, label, args.profiler)
                    cpu_before = cpu_seconds(pid)
                    samples = asyncio.run(run_load(port, request, args.requests, concurrency))
                    cpu_s = cpu_seconds(pid) - cpu_before
                    rows.append(report(name, concurrency, samples, args.ttft_ms, cpu_s))
                    sampler_show(sampler)
            finally:
                if process is not None:
                    process.terminate()
                    process.wait()
                else:
                    server.stop()
    floor_ratios(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def floor_ratios(rows: list[dict]) -> None:
    """Print chatsite's CPU per answer on each server against that server's raw floor."""
    cpu = {(row["server"], row["concurrency"]): row["cpu_ms_per_answer"] for row in rows}
    for (name, concurrency), spent in cpu.items():
        floor = cpu.get((FLOORS.get(name, ""), concurrency))
        if floor:
            print(
                f"{name} c={concurrency}: {spent:.2f} ms of CPU per answer against "
                f"{FLOORS[name]}'s {floor:.2f} ms: {spent / floor:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
