"""deploy/loopback_stack: docs/deploy.md performed on loopback, checked, then torn down.

Needs what the production profile's tests need (scripts/test): PostgreSQL on 127.0.0.1:5432 with
trust authentication for ``postgres``, and Redis on 127.0.0.1:6379; also nginx and curl. The
stack makes its own database and role; the pytest-django test database is not used.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis

from deploy.loopback_stack import (
    POSTGRES,
    REDIS,
    ROOT,
    LoopbackStack,
    StackError,
    guide_commands,
)
from tests.support import SSEReader

GUIDE = ROOT / "docs" / "deploy.md"
# The command line, as deploy/README.md and docs/deploy.md give it (run from the checkout).
COMMAND = [sys.executable, "-m", "deploy.loopback_stack"]


def unindented(text: str) -> str:
    """Lines without their indentation: a command reads the same in a list item or a block."""
    return "\n".join(line.strip() for line in text.splitlines())


def psql(*args: str) -> str:
    result = subprocess.run(
        ["psql", "-d", "postgres", *args],
        env={"PATH": os.environ["PATH"], **POSTGRES},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout


def databases() -> set[str]:
    return {line.split("|")[0].strip() for line in psql("-lqt").splitlines()} - {""}


def roles() -> set[str]:
    return set(psql("-Atc", "SELECT rolname FROM pg_roles").split())


def redis_keys(prefix: str) -> list[bytes]:
    client = redis.Redis(*REDIS)
    try:
        return list(client.scan_iter(f"{prefix}:*"))
    finally:
        client.close()


def running(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` (clock ticks) is still there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return started is None or int(stat.rsplit(")", 1)[1].split()[19]) == started


@pytest.fixture(scope="module", autouse=True)
def services() -> None:
    for name, (host, port) in {
        "PostgreSQL": (POSTGRES["PGHOST"], int(POSTGRES["PGPORT"])),
        "Redis": REDIS,
    }.items():
        try:
            socket.create_connection((host, port), timeout=2).close()
        except OSError:
            pytest.fail(f"{name} is not running on {host}:{port} (see docs/deploy.md)")


def ask(url: str, message: str) -> list[str]:
    """The event names of one answer, asked as the page asks: GET / for the cookies, then POST
    with the CSRF token."""
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/").status_code == 200
        token = client.cookies["csrftoken"]
        body = {"message": message, "conversation": None}
        reader, names = SSEReader(), []
        headers = {"X-CSRFToken": token}
        with client.stream("POST", "/api/chat/stream", json=body, headers=headers) as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                names += [event.event for event in reader.feed(chunk)]
    return names


def test_guide_shows_every_command_the_stack_runs() -> None:
    """Every command the loopback run performs is in docs/deploy.md, written as the guide's
    host runs it (sudo, /srv/chatsite, the role chatsite)."""
    guide = unindented(GUIDE.read_text())
    missing = [command for command in guide_commands() if unindented(command) not in guide]
    assert not missing, "\n\n".join(missing)


@pytest.mark.parametrize("server", ["daphne", "uvicorn", "both"])
def test_up_check_down(tmp_path: Path, server: str) -> None:
    """`up`, `check` and `down` from the command line: the site answers through nginx with two
    workers (of each server's unit; both: one of each, behind chatsite-servers.conf's two
    pools), and afterwards no database, role, Redis key, process or folder is left."""
    folder = tmp_path / "stack"

    def run(action: str, *extra: str) -> str:
        result = subprocess.run(
            [*COMMAND, action, "--dir", str(folder), *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=110,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    try:
        url = run("up", "--server", server).strip()
        state = json.loads((folder / "state.json").read_text())
        assert state["name"] in databases() and state["name"] in roles()
        assert len(state["workers"]) == 2
        units = {
            "daphne": ["chatsite@", "chatsite@"],
            "uvicorn": ["chatsite-uvicorn@", "chatsite-uvicorn@"],
            "both": ["chatsite@", "chatsite-uvicorn@"],
        }[server]
        assert sorted(name for name in state["processes"] if "@" in name) == sorted(
            f"{unit}{port}.service" for unit, port in zip(units, state["workers"], strict=True)
        ), state["processes"]
        names = ask(url, "[scripted tokens=4 ttft_ms=5 itl_ms=5] Are you there?")
        assert names[0] == "meta" and names.count("token") == 4 and names[-1] == "done", names
        found = json.loads(run("check"))
        assert found["upstreams"] == sorted(str(port) for port in state["workers"])
    finally:
        run("down")
    assert state["name"] not in databases()
    assert state["name"] not in roles()
    assert redis_keys(state["name"]) == []
    assert not [name for name, p in state["processes"].items() if running(p["pid"], p["started"])]
    assert not folder.exists()
    again = subprocess.run(
        [*COMMAND, "down", "--dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert again.returncode == 0 and "nothing to tear down" in again.stderr


class StopsBeforeTheStaffAccount(LoopbackStack):
    """A stack whose last step fails, once the database, the workers and nginx are up."""

    def _staff(self) -> None:
        assert self.state is not None
        self.made = (self.name, dict(self.state.processes))
        raise StackError("the staff account failed on purpose")


def test_failed_up_is_undone(tmp_path: Path) -> None:
    """An `up` that fails after the workers and nginx have started leaves nothing behind, and
    tearing down again is harmless."""
    stack = StopsBeforeTheStaffAccount(tmp_path / "stack")
    with pytest.raises(StackError, match="on purpose"), stack:
        pass
    name, processes = stack.made
    assert len(processes) == 3  # two workers and nginx
    assert name not in databases() and name not in roles()
    assert redis_keys(name) == []
    assert not [n for n, p in processes.items() if running(p.pid, p.started)]
    assert not (tmp_path / "stack").exists()
    stack.down()
