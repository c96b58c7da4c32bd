"""``python -m assistant.modelhost``: the supervisor that keeps one model process per host.

It binds the Unix socket every web worker of the host connects to, and keeps it for its whole
life; the model process (``runner.py``) inherits it. So a request never meets a refused
connection while the model process starts or restarts: it waits in the socket's backlog and is
answered once the model is loaded. When the model process ends (a crash, an abort, the OOM
killer) the supervisor logs how, counts it in ``ai_model_process_restarts_total{reason}`` and
starts it again: at once the first time, then after 0.5, 1, 2 ... up to 30 s while it keeps
ending within 30 s of its start. A request that arrives during a short wait (up to 2 s) waits
for the new process; during a longer one, or while the model cannot load at all, the supervisor
answers each request itself with the reason (``engine_restarting``, or the engine's own code),
so a crash loop costs a student one error, not a hung question.

Under systemd (``deploy/systemd/chatsite-model.service``) it reports ready once the first model
process is ready or has failed to load, and stops the model process with itself on SIGTERM.
"""

import argparse
import ctypes
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import protocol
from .protocol import Failure, HostStatus
from .runner import EXIT_UNAVAILABLE

logger = logging.getLogger("chatsite.modelhost")

DEFAULT_BACKEND = "assistant.engines.llamacpp.LlamaCppEngine"
#: A model process that ran this long ended for a new reason: the next restart is immediate.
STABLE_S = 30.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
#: A wait up to this long holds new requests in the backlog (they are answered once the model
#: process is back); a longer one answers them with the reason at once.
HOLD_S = 2.0
#: Seconds the model process has to stop after SIGTERM before it is killed.
STOP_GRACE_S = 10.0
#: How long a request answered during a wait may take to send its line.
DOWN_READ_TIMEOUT_S = 0.2
#: Signals whose name is a ``reason`` label; any other is ``signal``.
NAMED_SIGNALS = frozenset(
    {"SIGSEGV", "SIGKILL", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE", "SIGTERM"}
)
ROOT = Path(__file__).resolve().parents[2]

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a child process: the kernel kills it with SIGKILL when its parent
    dies, however the parent dies, so no model process outlives its supervisor."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def restart_delay(failures: int) -> float:
    """Seconds before the next start after ``failures`` ends in a row, each soon after its
    start: 0, then 0.5 s doubling up to 30 s."""
    if failures <= 1:
        return 0.0
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (failures - 2))


def exit_reason(returncode: int) -> tuple[str, str]:
    """How a process ended: a description (``SIGSEGV``, ``exit 3``) and a bounded label."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return name, name if name in NAMED_SIGNALS else "signal"
    if returncode == EXIT_UNAVAILABLE:
        return f"exit {returncode}", "load_failed"
    return f"exit {returncode}", "exit"


def notify(message: str) -> None:
    """Tell systemd (``Type=notify``) ``message``; nothing outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), address)


def bind(path: Path) -> socket.socket:
    """The listening socket at ``path`` (mode 0660: the workers run as the same user or
    group), in a directory of this user's that nobody else can write to; refuses to take over
    one another supervisor serves, or anything that is not a socket."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory = os.lstat(path.parent)
    if (
        not stat.S_ISDIR(directory.st_mode)
        or directory.st_uid != os.getuid()
        or directory.st_mode & 0o022
    ):
        raise SystemExit(f"{path.parent} must be a directory of this user's that only it writes.")
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    if existing is not None:
        if not stat.S_ISSOCK(existing.st_mode):
            raise SystemExit(f"{path} exists and is not a socket.")
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left behind by a supervisor that was killed
            else:
                raise SystemExit(f"Another model process already serves {path}.")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The model process's event loop makes the shared socket non-blocking anyway; the
    # supervisor accepts only after select() and copes with a connection taken meanwhile.
    listener.setblocking(False)
    previous = os.umask(0o117)
    try:
        listener.bind(str(path))
    finally:
        os.umask(previous)
    listener.listen(socket.SOMAXCONN)
    return listener


class Supervisor:
    def __init__(self, *, socket_path: Path, backend: str, options: dict[str, Any]) -> None:
        self.socket_path = socket_path
        self.backend = backend
        self.options = options
        self.restarts = 0
        self.last_exit: str | None = None
        self.last_exit_at: float | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self._notified = False
        from assistant import metrics  # prometheus_client only; files in the shared directory

        self.metrics = metrics

    def stop(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()

    def _spawn(self, listener: socket.socket) -> tuple[subprocess.Popen[bytes], int]:
        read_end, write_end = os.pipe()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # only the supervisor counts
        env.pop("NOTIFY_SOCKET", None)
        command = [
            sys.executable, "-m", "assistant.modelhost.runner",
            "--fd", str(listener.fileno()), "--status-fd", str(write_end),
            "--backend", self.backend, "--options", json.dumps(self.options),
            "--restarts", str(self.restarts),
            "--last-exit", self.last_exit or "", "--last-exit-at", str(self.last_exit_at or 0),
        ]  # fmt: skip
        child = subprocess.Popen(
            command, pass_fds=(listener.fileno(), write_end), env=env, preexec_fn=die_with_parent
        )
        os.close(write_end)
        return child, read_end

    def _wait_child(self) -> int:
        """The model process's exit status; killed if it ignores a stop for ``STOP_GRACE_S``."""
        assert self.child is not None
        stop_asked: float | None = None
        while True:
            try:
                return self.child.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if not self.stopping:
                    continue
                stop_asked = stop_asked or time.monotonic()
                if time.monotonic() - stop_asked > STOP_GRACE_S:
                    self.child.kill()

    def _ready(
        self, status_fd: int, listener: socket.socket, down: HostStatus | None
    ) -> dict[str, Any]:
        """The model process's first status line: ready, or why it cannot load; {} if it
        ended before saying anything. While it loads after failing to load (``down``), the
        supervisor keeps answering requests with that failure instead of holding them."""
        if down is not None:
            self._answer_while_down(listener, down, until=float("inf"), wake=status_fd)
        with os.fdopen(status_fd, "rb") as pipe:
            line = pipe.readline()
        try:
            return dict(json.loads(line)) if line else {}
        except ValueError:
            return {}

    def _notify_once(self, state: str) -> None:
        if not self._notified:
            self._notified = True
            notify("READY=1")
        notify(f"STATUS=model process {state}; {self.restarts} restarts")

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        listener = bind(self.socket_path)
        logger.info("Serving the model on %s (%s)", self.socket_path, self.backend)
        failures = 0
        #: Set while the last model process could not load the model (a missing file).
        cannot_load: HostStatus | None = None
        try:
            while not self.stopping:
                started = time.monotonic()
                self.child, status_fd = self._spawn(listener)
                if self.stopping:  # asked to stop while it was being started
                    self.child.terminate()
                said = self._ready(status_fd, listener, cannot_load)
                if said.get("ready"):
                    logger.info(
                        "Model process %d ready in %.0f ms", self.child.pid,
                        (time.monotonic() - started) * 1000,
                    )  # fmt: skip
                    self.metrics.MODEL_PROCESS_UP.set(1)
                    self._notify_once(f"up (pid {self.child.pid})")
                returncode = self._wait_child()
                self.metrics.MODEL_PROCESS_UP.set(0)
                if self.stopping:
                    break
                described, label = exit_reason(returncode)
                self.restarts += 1
                self.last_exit, self.last_exit_at = described, time.time()
                self.metrics.MODEL_PROCESS_RESTARTS.labels(reason=label).inc()
                failures = 1 if time.monotonic() - started >= STABLE_S else failures + 1
                delay = restart_delay(failures)
                logger.error(
                    "Model process %d ended (%s) after %.1f s; restarting in %.1f s",
                    self.child.pid, described, time.monotonic() - started, delay,
                )  # fmt: skip
                down = self._down_status(said, described, delay)
                cannot_load = down if said.get("code") else None
                self._notify_once(f"down ({down.code})")
                if delay <= HOLD_S and cannot_load is None:
                    time.sleep(delay)
                else:
                    self._answer_while_down(listener, down, until=time.monotonic() + delay)
        finally:
            listener.close()
            self.socket_path.unlink(missing_ok=True)
            if self.child is not None and self.child.poll() is None:
                self.child.kill()
                self.child.wait()

    def _down_status(self, said: dict[str, Any], described: str, delay: float) -> HostStatus:
        if said.get("code"):
            code, message = str(said["code"]), str(said.get("message", ""))
        else:
            code = "engine_restarting"
            message = f"The model process ended ({described}) and is restarting."
        return HostStatus(
            state="down", restarts=self.restarts, last_exit=self.last_exit,
            last_exit_at=self.last_exit_at, engine=self.backend.rsplit(".", 1)[-1],
            code=code, message=message, retry_after_s=delay,
        )  # fmt: skip

    def _answer_while_down(
        self, listener: socket.socket, status: HostStatus, *, until: float, wake: int | None = None
    ) -> None:
        """Until ``until``, or until ``wake`` is readable: answer each request with ``status``
        (and, to a generation, the reason as a failure), so nobody waits on a model that is not
        coming back soon."""
        failure = protocol.failure_line(
            Failure(status.code or "engine_restarting", status.message or "")
        )
        watched = [listener] if wake is None else [listener, wake]
        while not self.stopping:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            ready, _, _ = select.select(watched, [], [], min(remaining, 1.0))
            if wake is not None and wake in ready:
                return
            if listener not in ready:
                continue
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue  # the model process took it (it accepts on the same socket)
            with conn:
                conn.settimeout(DOWN_READ_TIMEOUT_S)
                try:
                    line = conn.makefile("rb").readline(protocol.MAX_LINE_BYTES)
                    request = protocol.request_parse(line)
                    remaining = until - time.monotonic()
                    retry = status.retry_after_s if until == float("inf") else round(remaining, 1)
                    line = protocol.hello_line(replace(status, retry_after_s=retry))
                    conn.sendall(line + (failure if request.op == "generate" else b""))
                except (OSError, protocol.ProtocolError):
                    pass  # a worker that left or sent nonsense: the next one


def _options_from_env() -> dict[str, Any]:
    """The embedded engine's options from the variables and defaults chatsite/settings.py
    gives ``llamacpp-inprocess``."""
    from chatsite.env import env_int, env_str

    return {
        "MODEL_PATH": env_str("CHATSITE_LLAMACPP_MODEL_PATH"),
        "N_THREADS": env_int("CHATSITE_LLAMACPP_THREADS", 0),
        "N_CTX": env_int("CHATSITE_LLAMACPP_N_CTX", 2048),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m assistant.modelhost",
        description="Run the embedded model in its own supervised process for every web worker.",
    )
    parser.add_argument("--socket", type=Path, default=None, help="default: CHATSITE_MODEL_SOCKET")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="engine class to host")
    parser.add_argument("--options", default=None, help="engine options as JSON (default: env)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s modelhost %(message)s")
    options = json.loads(args.options) if args.options else _options_from_env()
    if options.get("MODEL_PATH"):
        options["MODEL_PATH"] = str(Path(options["MODEL_PATH"]).resolve())
    socket_path = (args.socket or protocol.default_socket_path()).resolve()
    if len(str(socket_path)) > protocol.MAX_SOCKET_PATH:
        raise SystemExit(f"Socket path too long for a Unix socket: {socket_path}")
    supervisor = Supervisor(socket_path=socket_path, backend=args.backend, options=options)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        import atexit

        from prometheus_client import multiprocess

        atexit.register(multiprocess.mark_process_dead, os.getpid())
    supervisor.run()
