"""The long-running processes of a stack (workers, nginx), started and stopped as systemd would.

Each runs in a process group of its own, so it outlives ``up`` when that is run from the command
line and ``down`` (another process) can stop it with everything it forked. A pid alone is not
enough to stop a process later: the start time recorded with it tells whether the pid has been
reused since.
"""

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from assistant.benchmarking.ports import accepts

from .report import StackError, tail
from .state import Process


def start_time(pid: int) -> int | None:
    """/proc/<pid>/stat's start time (clock ticks since boot); None if there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class Supervisor:
    """Starts processes, waits for their ports, stops them. ``on_start`` records each one
    (name, pid and start time) as soon as it runs."""

    def __init__(self, on_start: Callable[[str, Process], None]) -> None:
        self._on_start = on_start
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cwd: str | Path,
        env: Mapping[str, str],
        log: Path,
        umask: int = -1,
    ) -> None:
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own process group, outliving `up` when run from the command line.
                start_new_session=True,
                umask=umask,
            )
        self._children[name] = process
        self._on_start(name, Process(process.pid, start_time(process.pid)))

    def wait_listening(self, name: str, port: int, log: Path, timeout: float = 60) -> None:
        """Until something accepts on 127.0.0.1:``port``; StackError if ``name`` exits first."""
        deadline = time.monotonic() + timeout
        process = self._children[name]
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"{name} exited with {process.returncode}:\n{tail(log)}")
            if accepts(port):
                return
            time.sleep(0.05)
        raise StackError(f"{name} is not listening on {port} after {timeout:.0f} s:\n{tail(log)}")

    def stop(self, name: str, process: Process) -> None:
        """SIGTERM to the process group, SIGKILL after 15 s; nothing if it is gone already."""
        child = self._children.pop(name, None)
        if process.started is not None and start_time(process.pid) != process.started:
            return  # gone already, and the pid may be someone else's by now
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if child is not None:
                if child.poll() is not None:
                    return
            elif start_time(process.pid) != process.started:
                return
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
        if child is not None:
            child.wait(10)
