"""``LoopbackStack``: docs/deploy.md from PostgreSQL onwards, in order, on loopback; and undone.

Each step lives with what it is about (``database``, ``redis_db``, ``envfile``, ``units``,
``nginx``); this class holds the stack's names, ports and folder, runs the steps in the guide's
order and keeps the state file up to date, so that ``down``, in the same process or a later one,
undoes exactly what was done, also after an ``up`` that failed half-way.
"""

import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from assistant.benchmarking.ports import free_port

from . import database
from .checks import check
from .client import STAFF
from .envfile import ENV_LOOPBACK, write_env_file
from .guide import run_command, run_manage, shell_env
from .layout import DEFAULT_DIR, ROOT, STATIC_ROOT, Layout
from .nginx import WORKER_CONNECTIONS, Edit, start_nginx
from .processes import Supervisor
from .redis_db import delete_redis_keys, ping
from .report import StackError, say
from .state import Process, State, load_state, save_state
from .units import BOTH, SERVER_CHOICES, WORKER_UNITS, start_site, start_unit, worker_servers


class LoopbackStack:
    """chatsite behind nginx with ``workers`` workers of ``server`` (daphne or uvicorn; both:
    half of each, in the two pools of chatsite-servers.conf), PostgreSQL and Redis, in ``work``.

    ``env``: lines set in the environment file after the loopback's own (what an operator
    would change in /etc/chatsite/env, e.g. ``CHATSITE_MAX_STREAMS``); ``worker_connections``:
    nginx's, in the rendered main config. As a context manager: up on entry (torn down again if
    that fails), down on exit."""

    def __init__(
        self,
        work: Path = DEFAULT_DIR,
        *,
        workers: int = 2,
        server: str = "daphne",
        env: Mapping[str, str] | None = None,
        worker_connections: int = WORKER_CONNECTIONS,
        nginx_edits: Sequence[Edit] = (),
    ) -> None:
        if workers < 1:
            raise ValueError("at least one worker")
        if server not in SERVER_CHOICES:
            raise ValueError(f"server is one of {', '.join(SERVER_CHOICES)}, not {server!r}")
        self.server = server
        self.layout = Layout(work.resolve())
        self.worker_count = workers
        self.extra_env = dict(env or {})
        self.worker_connections = worker_connections
        self.nginx_edits = tuple(nginx_edits)
        self.state: State | None = None
        self._processes = Supervisor(self._started)
        self._staff_password = ""
        self._database_url = ""

    @classmethod
    def load(cls, work: Path = DEFAULT_DIR) -> "LoopbackStack":
        """The stack whose state file is in ``work`` (none if there is no state file)."""
        stack = cls(work)
        stack.state = load_state(stack.state_file)
        if stack.state is not None:
            stack.worker_count = len(stack.state.workers)
            stack.server = stack.state.server
        return stack

    # --- where things are

    @property
    def work(self) -> Path:
        return self.layout.work

    @property
    def state_file(self) -> Path:
        return self.layout.state_file

    @property
    def env_file(self) -> Path:
        return self.layout.env_file

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def port(self) -> int:
        """nginx's port."""
        return self._state.port

    @property
    def workers(self) -> list[int]:
        """The workers' ports."""
        return self._state.workers

    @property
    def name(self) -> str:
        """The PostgreSQL role and database, and the Redis key prefix."""
        return self._state.name

    @property
    def _state(self) -> State:
        if self.state is None:
            raise StackError(f"no stack in {self.work}")
        return self.state

    def values(self) -> dict[str, str]:
        """The guide's placeholders, filled for this stack."""
        return {
            "as_chatsite": "",
            "as_postgres": "",
            "sudo": "",
            "root_owner": "",
            "role": self.name,
            "database": self.name,
            "env_file": str(self.env_file),
            "root": str(ROOT),
            "site": self.url,
            "noinput": " --noinput",
        }

    def to_loopback(self, text: str) -> str:
        """A production path in ``text`` as this stack's (the checkout is this one)."""
        return self.layout.to_loopback(text)

    def staff_password(self) -> str:
        return self._staff_password or self.layout.staff_password.read_text()

    def _save(self) -> None:
        save_state(self.state_file, self._state)

    def _started(self, name: str, process: Process) -> None:
        self._state.processes[name] = process
        self._save()

    # --- running the guide's commands

    def shell(self, key: str, *, timeout: float = 120, **env: str) -> str:
        """Run the guide's command ``key`` with this stack's values; its standard output."""
        return run_command(key, self.values(), self.work, timeout=timeout, env=env)

    def manage(self, key: str, **env: str) -> str:
        """Run the guide's ``manage ...`` command ``key`` the way its systemd-run does."""
        return run_manage(key, self.values(), self.layout, env)

    def start_unit(self, unit: str) -> None:
        """Start ``unit`` as systemd would, with this stack's paths."""
        start_unit(unit, self.layout, self._processes)

    def sql(self, query: str) -> str:
        return database.sql(self.name, query, shell_env(self.work))

    # --- up

    def __enter__(self) -> "LoopbackStack":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        if self.state_file.exists():
            raise StackError(f"a stack is already up in {self.work}: run `down` first")
        self.work.mkdir(parents=True, exist_ok=True)
        self.layout.logs.mkdir(exist_ok=True)
        self.state = State(
            name=f"chatsite_loopback_{secrets.token_hex(4)}",
            workers=[free_port() for _ in range(self.worker_count)],
            port=free_port(),
            created_static_root=not STATIC_ROOT.exists(),
            server=self.server,
        )
        self._save()
        self.shell("compileall")
        self._database_url = database.create(self.shell)
        ping(self.shell)
        self._environment()
        self.manage("migrate")
        self.manage("collectstatic")
        start_site(self.workers, self.layout, self._processes, self.server)
        self._nginx()
        self._staff()
        say(f"up: {self.url}/ ({len(self.workers)} workers, folder {self.work})")

    def _environment(self) -> None:
        values = {
            "DATABASE_URL": self._database_url,
            **ENV_LOOPBACK,
            # Two stacks (or a test run and a site) can share one Redis.
            "CHATSITE_REDIS_PREFIX": self.name,
            **self.extra_env,
        }
        write_env_file(self.env_file, self.shell, values, self.to_loopback)

    def _nginx(self) -> None:
        servers = worker_servers(self.workers, self.server)
        pools = {name: [port for port in servers if servers[port] == name] for name in WORKER_UNITS}
        both = self.server == BOTH
        start_nginx(
            self._processes,
            self.layout.nginx,
            site="chatsite-servers.conf" if both else "chatsite.conf",
            workers=pools["daphne"] if both else self.workers,
            uvicorn_workers=pools["uvicorn"] if both else [],
            port=self.port,
            static_root=STATIC_ROOT,
            worker_connections=self.worker_connections,
            edits=self.nginx_edits,
            env=shell_env(self.work),
        )

    def _staff(self) -> None:
        self._staff_password = secrets.token_urlsafe(16)
        self.layout.staff_password.write_text(self._staff_password)
        self.manage(
            "createsuperuser",
            DJANGO_SUPERUSER_USERNAME=STAFF["username"],
            DJANGO_SUPERUSER_EMAIL=STAFF["email"],
            DJANGO_SUPERUSER_PASSWORD=self._staff_password,
        )

    # --- check

    def check(self) -> dict[str, Any]:
        """The guide's checks, then what a user and an operator would look at. Raises
        ``StackError`` naming the first thing that is wrong; returns what it measured."""
        return check(self)

    # --- down

    def down(self) -> None:
        """Undo whatever ``up`` did, whatever state it stopped in; safe to run twice."""
        if self.state is None:
            say(f"nothing to tear down in {self.work}")
            return
        problems = self._stop_processes()
        problems += database.drop(self.name, shell_env(self.work))
        try:
            delete_redis_keys(self.name)
        except (OSError, redis.RedisError) as exc:
            problems.append(f"deleting Redis keys {self.name}:*: {exc}")
        if self._state.created_static_root:
            shutil.rmtree(STATIC_ROOT, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.state = None
        if problems:
            raise StackError("teardown incomplete:\n" + "\n".join(problems))
        say("down")

    def _stop_processes(self) -> list[str]:
        problems = []
        processes = self._state.processes
        # nginx first, so no request reaches a worker that is going away.
        for name in sorted(processes, key=lambda n: n != "nginx"):
            try:
                self._processes.stop(name, processes[name])
            except OSError as exc:
                problems.append(f"stopping {name}: {exc}")
        return problems
