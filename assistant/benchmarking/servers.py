"""Real servers on loopback for benchmarks, tests and tooling.

A benchmark of the serving stack and a test of it need the same thing: chatsite under Daphne (and,
for the embedded model, the supervised model process) started as deployed, on a free port, and
waited for until it answers. Both live here so that benchmarks need nothing from the tests; what
only tests want of such a server (their relaxed limits) is added by ``tests/support.py``.

Every process started here dies with the process that started it (``die_with_parent``), however
that one ends, so none outlives its run.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from assistant.modelhost.supervisor import die_with_parent

from .ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def short_socket_path() -> Path:
    """A fresh path for a Unix socket: at most 107 bytes, which pytest's tmp_path can exceed."""
    return Path(tempfile.mkdtemp(prefix="chm-")) / "model.sock"


def terminate(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """SIGTERM, then SIGKILL if ``process`` is still there after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class LiveServer:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    events_file: Path
    log_file: Path
    #: The model process this server's embedded engine talks to, when one was started for it.
    model_host: "ModelHost | None" = None

    def engine_events(self, tag: str | None = None) -> list[dict[str, Any]]:
        """What the scripted engine recorded (start/finish/cancel), optionally for one tag."""
        if not self.events_file.exists():
            return []
        rows = [json.loads(line) for line in self.events_file.read_text().splitlines() if line]
        return [r for r in rows if tag is None or r.get("tag") == tag]

    def wait_engine_event(self, tag: str, event: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for row in self.engine_events(tag):
                if row["event"] == event:
                    return row
            time.sleep(0.005)
        raise AssertionError(
            f"engine never recorded {event!r} for {tag!r}: {self.engine_events(tag)}"
        )

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stop(self) -> None:
        terminate(self.process, timeout=10)
        if self.model_host is not None:
            self.model_host.stop()


class ModelHost:
    """``python -m assistant.modelhost``: the supervised model process, on a socket of its own.

    ``backend`` is the engine class it hosts: the real embedded model by default, or the
    scripted engine where what matters is the process boundary rather than the model."""

    def __init__(
        self,
        log: Path,
        *,
        backend: str = "assistant.engines.llamacpp.LlamaCppEngine",
        options: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        socket: Path | None = None,
    ) -> None:
        from assistant.engines.model_process import ModelProcessEngine

        #: The directory this made for the socket, removed by ``stop``.
        self.own_dir = None if socket else short_socket_path().parent
        self.socket = socket or self.own_dir / "model.sock"  # type: ignore[operator]
        self.log = log
        command = [sys.executable, "-m", "assistant.modelhost", "--socket", str(self.socket)]
        command += ["--backend", backend]
        if options is not None:
            command += ["--options", json.dumps(options)]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self.client = ModelProcessEngine("test", {"SOCKET": str(self.socket)})
        self.wait_until(lambda status: status.state != "starting", timeout=90)

    def status(self) -> Any:
        from assistant.engines import EngineUnavailable

        try:
            return self.client.status_fetch()
        except EngineUnavailable:
            from assistant.modelhost.protocol import HostStatus

            return HostStatus(state="starting")  # not bound yet

    def wait_until(self, predicate: Callable[[Any], Any], timeout: float = 60) -> Any:
        """The first status that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.log.read_text(errors="replace")
                raise RuntimeError(f"the model host exited:\n{log}")
            status = self.status()
            if predicate(status):
                return status
            time.sleep(0.02)
        raise AssertionError(f"model host never got there: {self.status()}\n{self.log.read_text()}")

    def kill_runner(self, sig: int) -> int:
        """Send ``sig`` to the model process (not the supervisor); its pid."""
        pid = int(self.status().pid)
        assert pid > 0, self.status()
        os.kill(pid, sig)
        return pid

    def stop(self) -> None:
        terminate(self.process, timeout=15)
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)


def database_env(name: str) -> dict[str, str]:
    """Settings that point a server process at the database ``name``: on the same PostgreSQL
    server as DATABASE_URL when that is set, else a SQLite file."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return {"DATABASE_URL": urlunsplit(urlsplit(url)._replace(path="/" + name))}
    return {"CHATSITE_SQLITE_PATH": name}


#: A chatsite server as deployed (debug off: no SQL logging, no autoreload of static files), with
#: no per-student limits, since one client asks every question of a benchmark.
BENCHMARK_ENV = {
    "CHATSITE_DEBUG": "0",
    "DJANGO_SECRET_KEY": "benchmark-only-secret-key-0123456789abcdefghijkl",
    "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "CHATSITE_TLS": "0",
    "CHATSITE_SCRIPTED_EVENTS_FILE": "",
    "CHATSITE_STREAMS_PER_SESSION": "0",
    "CHATSITE_CHAT_RATE": "100000000",
    "CHATSITE_NEW_SESSIONS_PER_MINUTE": "100000",
    # Stopped after its run, a server drains what a client left open for at most this long.
    "CHATSITE_DRAIN_S": "2",
}

#: Headless Chromium as the page tests and benchmarks run it: nothing fetched from elsewhere.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def chromium_executable() -> str | None:
    """A system Chromium (``CHATSITE_CHROMIUM`` or on PATH); None uses Playwright's own build."""
    return (
        os.environ.get("CHATSITE_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )


def start_daphne(
    *,
    workdir: Path,
    db_path: str,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
    port: int | None = None,
    uvicorn: bool = False,
) -> LiveServer:
    """Start Daphne with chatsite on a free loopback port and wait until it serves.

    ``db_path`` names the database (see ``database_env``). The engine is the scripted one,
    recording to the server's ``events_file``, unless ``env`` says otherwise; every other
    setting is the settings' default or the environment's, and ``env`` overrides them all.
    Logs and the engine's records go to ``workdir``. ``root`` is the checkout whose code runs
    (another one compares two versions in one run); ``port``, a port to serve on again (a
    worker restarted), else a free one. ``uvicorn``: the same application under uvicorn instead,
    as ``python -m chatsite.uvicorn_server`` runs it in production."""
    port = port or free_port()
    events_file = workdir / f"engine-events-{port}.jsonl"
    log_file = workdir / f"daphne-{port}-{time.monotonic_ns()}.log"
    env = dict(env or {})
    model_host = None
    if env.get("CHATSITE_ENGINE") == "llamacpp" and "CHATSITE_MODEL_SOCKET" not in env:
        # The embedded model runs in its own process, as ./scripts/run and systemd run it.
        model_host = ModelHost(workdir / f"modelhost-{port}.log", env=env)
        env["CHATSITE_MODEL_SOCKET"] = str(model_host.socket)
    full_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "CHATSITE_ENGINE": "scripted",
        **database_env(db_path),
        "CHATSITE_SCRIPTED_EVENTS_FILE": str(events_file),
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    if uvicorn and (root / "chatsite" / "uvicorn_server.py").exists():
        # The production worker: it reads chatsite's settings (CHATSITE_DRAIN_S and the rest).
        command = ["chatsite.uvicorn_server", "--host", "127.0.0.1", "--port", str(port)]
    elif uvicorn:
        # An older checkout (``root``) without it: uvicorn's own command, given the drain.
        from chatsite.uvicorn_server import graceful_shutdown_s

        drain_s = str(graceful_shutdown_s(float(full_env.get("CHATSITE_DRAIN_S", "25"))))
        command = ["uvicorn", "--no-access-log", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--timeout-graceful-shutdown", drain_s, "chatsite.asgi:application"]
    else:
        command = ["chatsite.server", "-b", "127.0.0.1", "-p", str(port)]
        command += ["chatsite.asgi:application"]
    process = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=root,
        env=full_env,
        stdout=log_file.open("wb"),
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )
    server = LiveServer(
        f"http://127.0.0.1:{port}", port, process, events_file, log_file, model_host=model_host
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"daphne did not start:\n{server.log()}")
