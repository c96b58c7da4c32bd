"""What the fault tests share: a PostgreSQL server of their own that they can stop and start, a
model server they can kill, an upstream that never answers, and /metrics read as numbers."""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from assistant.benchmarking.ports import free_port
from tests.support import ROOT, Event, LiveServer, wait_for


def metric(server: LiveServer, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples on ``server``'s /metrics whose labels include ``labels``."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def kinds(events: list[Event]) -> list[str]:
    return [e.event for e in events]


def text_of(events: list[Event]) -> str:
    return "".join(e.json()["text"] for e in events if e.event == "token")


def assert_partial_answer_kept(events: list[Event], error_code: str) -> None:
    """What the stream's ``events`` showed before it failed is stored as a partial answer, and
    its record says it failed with ``error_code`` (a test with database access)."""
    from assistant.models import Message, StreamRecord

    meta = events[0].json()
    answer = wait_for(lambda: Message.objects.filter(id=meta["message"]).first())
    assert answer.status == "partial"
    assert answer.content == text_of(events) and answer.content
    record = wait_for(lambda: StreamRecord.objects.filter(request_id=meta["request_id"]).first())
    assert (record.outcome, record.error_code) == ("engine_error", error_code)


def postgres_bin(tool: str) -> str | None:
    """``tool`` from PATH, else from the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(tool)
    if found:
        return found
    candidates = glob.glob(f"/usr/lib/postgresql/*/bin/{tool}")
    major = lambda path: float(Path(path).parent.parent.name)  # noqa: E731
    return max(candidates, key=major) if candidates else None


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary directory, on its own loopback port, trust auth.

    initdb refuses to run as root, so as root every server command runs as the ``postgres``
    system user, which owns the directory. ``stop``/``start`` take the server down and bring it
    back with its data, as an outage or a failover would.
    """

    def __init__(self, dbname: str = "chatsite_faults") -> None:
        self.dbname = dbname
        self.port = free_port()
        # The real directory, not a symlink on PATH: createdb lives beside pg_ctl there.
        self.bindir = Path(postgres_bin("pg_ctl") or "pg_ctl").resolve().parent
        self.root = Path(tempfile.mkdtemp(prefix="chatsite-faults-pg-"))
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self._as_owner: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self._as_owner = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def _run(self, tool: str, *args: str) -> None:
        command = [*self._as_owner, str(self.bindir / tool), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode:
            raise RuntimeError(
                f"{tool} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                f"{self.log()}"
            )

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.logfile.read_text(errors="replace")
        return ""

    def create(self) -> None:
        """initdb, start, create the database, and migrate it."""
        self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()
        self._run(
            "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.dbname
        )
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "DATABASE_URL": self.url,
        }
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=120,
        )

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories='' "
            "-c fsync=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl", "start", "-w", "-D", str(self.datadir), "-l", str(self.logfile), "-o", options
        )

    def stop(self) -> None:
        self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.datadir))

    def running(self) -> bool:
        return (self.datadir / "postmaster.pid").exists()

    def destroy(self) -> None:
        if self.running():
            with contextlib.suppress(Exception):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()


class SilentUpstream:
    """A TCP server on loopback that accepts connections, reads what they send and never
    answers. ``closed`` counts connections the other side has closed."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted = 0
        self.closed = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            thread = threading.Thread(target=self._swallow, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _swallow(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.2)
            while not self._stopping:
                try:
                    if not conn.recv(65536):
                        self.closed += 1
                        return
                except TimeoutError:
                    continue
                except OSError:
                    self.closed += 1
                    return

    def __enter__(self) -> "SilentUpstream":
        thread = threading.Thread(target=self._serve, daemon=True)
        self._threads.append(thread)
        thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self.listener.close()
        for thread in self._threads:
            thread.join(2)
