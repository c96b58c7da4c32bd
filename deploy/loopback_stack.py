"""docs/deploy.md performed on loopback, as an ordinary user, then torn down.

    .venv/bin/python deploy/loopback_stack.py up [--workers N] [--dir DIR] [--env NAME=VALUE ...]
    .venv/bin/python deploy/loopback_stack.py check [--dir DIR]
    .venv/bin/python deploy/loopback_stack.py down [--dir DIR]

``up`` takes the guide's steps from PostgreSQL onwards with the shipped files: a new role and
database on the PostgreSQL server at 127.0.0.1:5432 (trust authentication, superuser
``postgres``), the Redis at 127.0.0.1:6379 under a key prefix of its own, an environment file
made from deploy/env.example, migrations and static files, the systemd units of deploy/systemd/
run as systemd would run them (their ExecStart=, environment and working directory), and nginx
with deploy/nginx/ rendered for the workers' ports. ``check`` runs the guide's curl checks and
looks further: cookies, both workers behind nginx, rows in PostgreSQL, keys in Redis, metrics
shared between workers, static files from STATIC_ROOT, the staff dashboard. ``down`` stops the
processes, drops the database and role, deletes the Redis keys and the folder; it also undoes a
failed ``up``, because every name is written to the folder's state file before it is used.

What differs from a real host is one substitution each, tabled at the end of the guide: paths
under the folder instead of /etc/chatsite and /run, this checkout instead of /srv/chatsite, this
user instead of ``chatsite`` and ``postgres``, free ports instead of 80, 8001 and 8002, plain
HTTP (CHATSITE_TLS=0) and the scripted engine instead of a model. The guide's commands are
``COMMANDS``, ``MANAGE_FUNCTION`` and ``MANAGE_COMMANDS``, filled from ``PRODUCTION`` for the
guide and from ``LoopbackStack.values()`` here; tests/deploy/test_loopback_stack.py checks that
the guide shows each of them as written.
"""

import argparse
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from http.client import HTTPConnection, HTTPResponse
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
NGINX_DIR = ROOT / "deploy" / "nginx"
SYSTEMD_DIR = ROOT / "deploy" / "systemd"
STATIC_DIR = ROOT / "frontend" / "static"
# settings.STATIC_ROOT: BASE_DIR / "staticfiles", not configurable from the environment.
STATIC_ROOT = ROOT / "staticfiles"
DEFAULT_DIR = Path(tempfile.gettempdir()) / "chatsite-loopback"

POSTGRES = {"PGHOST": "127.0.0.1", "PGPORT": "5432", "PGUSER": "postgres"}
REDIS = ("127.0.0.1", 6379)

# --- nginx: the shipped site rendered for loopback ports -----------------------------------

# What the shipped files use as examples, and so what a rendering replaces (each must occur).
EXAMPLE_WORKERS = ("server 127.0.0.1:8001;", "server 127.0.0.1:8002;")
EXAMPLE_LISTEN = ("listen 80;", "listen [::]:80;")
EXAMPLE_STATIC_ROOT = "/srv/chatsite/staticfiles/"
EXAMPLE_ACCESS_LOG = "/var/log/nginx/chatsite.access.log"

# The smallest main configuration a site needs, everything nginx writes kept in the run's folder.
# Each open stream holds two of the worker's connections (the client's and the upstream's).
MAIN_CONF = """\
{user}daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{
    worker_connections {worker_connections};
}}
http {{
    types {{
        text/html html;
    }}
    default_type application/octet-stream;
    client_body_temp_path {work}/client_body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    include {site};
}}
"""

# (file under deploy/nginx, text, replacement): a deliberate change to a shipped file.
Edit = tuple[str, str, str]
WORKER_CONNECTIONS = 512


def render(
    work: Path,
    site: str,
    *,
    workers: Sequence[int],
    port: int,
    edits: Sequence[Edit] = (),
    static_root: Path = STATIC_DIR,
    worker_connections: int = WORKER_CONNECTIONS,
) -> Path:
    """Copy deploy/nginx into ``work`` for this run and wrap ``site`` in a main config.

    The upstream gets one ``server`` line per port in ``workers``; nginx listens on
    127.0.0.1:``port`` and serves /static/ from ``static_root``, its one worker process with
    ``worker_connections``. Nothing else changes but ``edits``."""
    conf = work / "conf"
    shutil.copytree(NGINX_DIR, conf)
    # The first worker replaces the first example line, every other one the second.
    first, *others = (f"server 127.0.0.1:{worker};" for worker in workers)
    replacements = {
        EXAMPLE_WORKERS[0]: first,
        EXAMPLE_WORKERS[1]: "\n    ".join(others),
        EXAMPLE_LISTEN[0]: f"listen 127.0.0.1:{port};",
        EXAMPLE_LISTEN[1]: "",
        EXAMPLE_STATIC_ROOT: f"{static_root}/",
        EXAMPLE_ACCESS_LOG: str(work / "access.log"),
    }
    files = [conf / site, *sorted((conf / "snippets").glob("*.conf"))]
    texts = {path: path.read_text() for path in files}
    for old in replacements:
        assert any(old in text for text in texts.values()), f"{old!r} is no longer in {site}"
    # One pass, so that a port written by one replacement is never replaced again.
    pattern = re.compile("|".join(re.escape(old) for old in replacements))
    texts = {
        path: pattern.sub(lambda m: replacements[m.group()], text) for path, text in texts.items()
    }
    for name, old, new in edits:
        path = conf / name
        assert texts[path].count(old) == 1, f"{old!r} is not in {name} exactly once"
        texts[path] = texts[path].replace(old, new)
    for path, text in texts.items():
        path.write_text(text)
    user = f"user {pwd.getpwuid(0).pw_name};\n" if os.geteuid() == 0 else ""
    main = conf / "nginx.conf"
    main.write_text(
        MAIN_CONF.format(
            user=user, work=work, site=conf / site, worker_connections=worker_connections
        )
    )
    return main


def nginx_args(binary: str, main: Path) -> list[str]:
    work = main.parent.parent
    return [binary, "-p", f"{work}/", "-c", str(main), "-e", str(work / "error.log")]


# --- the guide's commands ------------------------------------------------------------------

# Shell commands of docs/deploy.md. ``{name}`` is filled from PRODUCTION for the guide and from
# the stack's own values on loopback; any other brace (curl's %{http_code}) is left alone.
COMMANDS = {
    "compileall": (
        "{as_chatsite}{root}/.venv/bin/python -m compileall -q {root}/chatsite {root}/assistant"
    ),
    "createuser": "{as_postgres}createuser {role}",
    "createdb": "{as_postgres}createdb --owner={role} {database}",
    "password": r"""
password=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
{as_postgres}psql -c "ALTER ROLE {role} PASSWORD '$password'"
echo "DATABASE_URL=postgres://{role}:$password@127.0.0.1:5432/{database}"
""",
    "redis": "redis-cli -h 127.0.0.1 -p 6379 ping",
    "env_file": "{sudo}install -D -m 0600{root_owner} deploy/env.example {env_file}",
    "secret": "python3 -c 'import secrets; print(secrets.token_urlsafe(50))'",
    "ready": r"curl -sS -w ' %{http_code}\n' {site}/readyz",
    "metrics": r"curl -sS -o /dev/null -w '%{http_code}\n' {site}/metrics",
    "dashboard": r"curl -sS -o /dev/null -w '%{http_code} %{redirect_url}\n' {site}/dashboard/",
    "stream": r"""
jar=$(mktemp)
curl -sS -c "$jar" -o /dev/null {site}/
curl -sS -N -b "$jar" -H "X-CSRFToken: $(awk '$6 == "csrftoken" {print $7}' "$jar")" \
    -H 'Content-Type: application/json' -d '{"message": "Hello!", "conversation": null}' \
    {site}/api/chat/stream
rm "$jar"
""",
    "prune": """
{as_postgres}psql {database} -c \\
    "DELETE FROM assistant_streamrecord WHERE created_at < now() - interval '30 days'"
""",
}
COMMANDS = {key: command.strip() for key, command in COMMANDS.items()}

# manage.py as the units run the app: systemd reads the environment file (root's alone), then
# runs the command as chatsite in /srv/chatsite. The guide defines it; ``manage`` below parses
# it, so what runs on loopback is what the guide says.
MANAGE_FUNCTION = """\
manage() {
    sudo systemd-run --quiet --pty --wait --collect --uid=chatsite --gid=chatsite \\
        --working-directory=/srv/chatsite --property=EnvironmentFile=/etc/chatsite/env \\
        /srv/chatsite/.venv/bin/python manage.py "$@"
}"""
MANAGE_COMMANDS = {
    "migrate": "manage migrate --noinput",
    "collectstatic": "manage collectstatic --noinput",
    "createsuperuser": "manage createsuperuser{noinput}",
}

# The guide's values. The loopback stack's come from ``LoopbackStack.values``.
PRODUCTION = {
    "as_chatsite": "sudo -u chatsite ",
    "as_postgres": "sudo -u postgres ",
    "sudo": "sudo ",
    "root_owner": " -o root -g root",
    "role": "chatsite",
    "database": "chatsite",
    "env_file": "/etc/chatsite/env",
    "root": "/srv/chatsite",
    "site": "http://127.0.0.1",
    "noinput": "",
}

# The lines of /etc/chatsite/env the guide asks to change, and what the loopback stack writes.
ENV_LOOPBACK = {
    # What the guide says until the site has its certificate; loopback stays on plain HTTP.
    "CHATSITE_TLS": "0",
    # Instead of a model (vLLM or llama.cpp): deterministic tokens, nothing to load.
    "CHATSITE_ENGINE": "scripted",
}
WORKER_UNIT = "chatsite@.service"
STAFF = {"username": "loopback-staff", "email": "staff@example.org"}


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` of ``values`` replaced; other braces untouched."""
    return re.sub(
        r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template, flags=re.ASCII
    )


def guide_commands() -> list[str]:
    """Every command of docs/deploy.md this script performs, as the guide writes it."""
    return [
        MANAGE_FUNCTION,
        *(fill(c, PRODUCTION) for c in [*COMMANDS.values(), *MANAGE_COMMANDS.values()]),
    ]


# --- systemd, the parts the chatsite units use ----------------------------------------------

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def read_unit(path: Path, instance: str = "") -> dict[str, dict[str, list[str]]]:
    """The sections of a unit file: each key's values in order, ``%i`` filled with
    ``instance``. Continued lines are joined, comments inside them skipped, as systemd does;
    an empty assignment resets the key."""
    lines: list[str] = []
    pending: str | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if pending is not None:
            if line.startswith(("#", ";")):
                continue
            if line.endswith("\\"):
                pending += " " + line[:-1].strip()
                continue
            lines.append(f"{pending} {line}")
            pending = None
        elif not line or line.startswith(("#", ";")):
            continue
        elif line.endswith("\\"):
            pending = line[:-1].strip()
        else:
            lines.append(line)
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        value = _specifiers(value.strip(), instance, path)
        if value:
            current.setdefault(key.strip(), []).append(value)
        else:
            current[key.strip()] = []
    return sections


def _specifiers(value: str, instance: str, path: Path) -> str:
    def one(match: re.Match[str]) -> str:
        letter = match.group(1)
        if letter in "iI":
            return instance
        if letter == "%":
            return "%"
        raise ValueError(f"{path.name}: specifier %{letter} is not supported here")

    return re.sub(r"%(.)", one, value)


def read_env_file(path: Path) -> dict[str, str]:
    """NAME=value lines as systemd's EnvironmentFile= reads them (comments at the start of a
    line, surrounding quotes removed, no expansion)."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not NAME=value: {line!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[name.strip()] = value
    return env


def set_env_lines(path: Path, values: Mapping[str, str]) -> None:
    """Set NAME=value in an environment file: the active line if there is one, else the
    commented-out example (``# NAME=...``), else a new line at the end."""
    lines = path.read_text().splitlines()
    for name, value in values.items():
        active = [i for i, line in enumerate(lines) if line.startswith(f"{name}=")]
        example = [i for i, line in enumerate(lines) if re.match(rf"#\s*{name}=", line)]
        index = (active or example or [None])[0]
        if index is None:
            lines.append(f"{name}={value}")
        else:
            lines[index] = f"{name}={value}"
    path.write_text("\n".join(lines) + "\n")


# --- the stack --------------------------------------------------------------------------------


@dataclass
class Process:
    pid: int
    # /proc/<pid>/stat's start time: a pid that has been reused since is not ours to stop.
    started: int | None


@dataclass
class State:
    name: str
    workers: list[int]
    port: int
    created_static_root: bool
    processes: dict[str, Process] = field(default_factory=dict)


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return f"({path.name}: nothing written)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def say(message: str) -> None:
    print(f"[loopback] {message}", file=sys.stderr, flush=True)


class LoopbackStack:
    """chatsite behind nginx with ``workers`` Daphne workers, PostgreSQL and Redis, in ``work``.

    ``env``: lines set in the environment file after the loopback's own (what an operator
    would change in /etc/chatsite/env, e.g. ``CHATSITE_MAX_STREAMS``); ``worker_connections``:
    nginx's, in the rendered main config. As a context manager: up on entry (torn down again if
    that fails), down on exit."""

    def __init__(
        self,
        work: Path = DEFAULT_DIR,
        *,
        workers: int = 2,
        env: Mapping[str, str] | None = None,
        worker_connections: int = WORKER_CONNECTIONS,
        nginx_edits: Sequence[Edit] = (),
    ) -> None:
        if workers < 1:
            raise ValueError("at least one worker")
        self.work = work.resolve()
        self.worker_count = workers
        self.extra_env = dict(env or {})
        self.worker_connections = worker_connections
        self.nginx_edits = tuple(nginx_edits)
        self.state: State | None = None
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._staff_password = ""
        self._database_url = ""

    # --- where things are

    @property
    def state_file(self) -> Path:
        return self.work / "state.json"

    @property
    def env_file(self) -> Path:
        return self.work / "etc" / "chatsite" / "env"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._state.port}"

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
        places = {
            "/srv/chatsite": str(ROOT),
            "/etc/chatsite": str(self.work / "etc" / "chatsite"),
            "/run": str(self.work / "run"),
        }
        pattern = r"(?<![^\s=\"'])(" + "|".join(map(re.escape, places)) + r")(?=[/\s\"']|$)"
        return re.sub(pattern, lambda m: places[m.group(1)], text)

    def _save(self) -> None:
        self.state_file.write_text(json.dumps(asdict(self._state), indent=2) + "\n")

    @classmethod
    def load(cls, work: Path = DEFAULT_DIR) -> "LoopbackStack":
        stack = cls(work)
        if stack.state_file.exists():
            data = json.loads(stack.state_file.read_text())
            data["processes"] = {k: Process(**v) for k, v in data["processes"].items()}
            stack.state = State(**data)
            stack.worker_count = len(stack.state.workers)
        return stack

    # --- running commands

    def _shell_env(self, **extra: str) -> dict[str, str]:
        """A clean environment, as sudo would give: no DATABASE_URL or settings of the caller's.
        ``postgres`` on loopback is reached over TCP as PGUSER instead of `sudo -u postgres`."""
        return {
            "PATH": os.environ.get("PATH", DEFAULT_PATH),
            "HOME": str(self.work),
            "LANG": "C.UTF-8",
            **POSTGRES,
            **extra,
        }

    def shell(self, key: str, *, timeout: float = 120, **env: str) -> str:
        """Run the guide's command ``key`` with this stack's values; its standard output."""
        command = fill(COMMANDS[key], self.values())
        say(f"$ {command}")
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=ROOT,
            env=self._shell_env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise StackError(f"{key} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def manage(self, key: str, **env: str) -> str:
        """Run the guide's ``manage ...`` command ``key`` the way its systemd-run does."""
        command = fill(MANAGE_COMMANDS[key], self.values())
        say(f"$ {command}")
        body = "\n".join(MANAGE_FUNCTION.splitlines()[1:-1]).replace("\\\n", " ")
        words = shlex.split(self.to_loopback(body))
        assert words[:2] == ["sudo", "systemd-run"], words
        options = [w for w in words[2:] if w.startswith("-")]
        program = [w for w in words[2:] if not w.startswith("-")]
        assert program[-1] == "$@", program
        workdir = next(o.split("=", 1)[1] for o in options if o.startswith("--working-dir"))
        env_files = [o.split("EnvironmentFile=", 1)[1] for o in options if "EnvironmentFile=" in o]
        service = {"EnvironmentFile": env_files, "WorkingDirectory": [workdir]}
        argv = [*program[:-1], *shlex.split(command)[1:]]
        result = subprocess.run(
            argv,
            cwd=workdir,
            env={**self._service_env(service), **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            raise StackError(f"{command} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def _service_env(self, service: Mapping[str, list[str]]) -> dict[str, str]:
        """A service's environment as systemd builds it: a few basics, Environment=, then
        EnvironmentFile= (which wins), then UnsetEnvironment=."""
        env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": str(self.work)}
        for line in service.get("Environment", []):
            for word in shlex.split(line):
                name, _, value = word.partition("=")
                env[name] = value
        for entry in service.get("EnvironmentFile", []):
            optional = entry.startswith("-")
            path = Path(self.to_loopback(entry.removeprefix("-")))
            if path.exists() or not optional:
                env.update(read_env_file(path))
        for line in service.get("UnsetEnvironment", []):
            for name in line.split():
                env.pop(name, None)
        return {name: self.to_loopback(value) for name, value in env.items()}

    def start_unit(self, unit: str) -> None:
        """Start ``unit`` (``name.service`` or ``name@instance.service``) as systemd would, with
        this stack's paths: a oneshot runs to the end, anything else keeps running."""
        stem, _, suffix = unit.rpartition(".")
        template, at, instance = stem.partition("@")
        path = SYSTEMD_DIR / (f"{template}@.{suffix}" if at else unit)
        service = read_unit(path, instance).get("Service", {})
        for name in service.get("RuntimeDirectory", []):
            mode = int(service.get("RuntimeDirectoryMode", ["0755"])[-1], 8)
            (self.work / "run" / name).mkdir(mode=mode, parents=True, exist_ok=True)
        env = self._service_env(service)
        workdir = self.to_loopback(service.get("WorkingDirectory", [str(ROOT)])[-1])
        umask = int(service.get("UMask", ["0022"])[-1], 8)
        commands = service.get("ExecStartPre", []) + service.get("ExecStart", [])
        kind = service.get("Type", ["simple"])[-1]
        for number, line in enumerate(commands, 1):
            argv = self._exec_argv(line, env)
            say(f"{unit}: {shlex.join(argv)}")
            log = self.work / "log" / f"{unit}.log"
            if kind == "oneshot" or number < len(commands):
                with log.open("ab") as out:
                    rc = subprocess.run(
                        argv, cwd=workdir, env=env, stdout=out, stderr=out, umask=umask
                    ).returncode
                if rc != 0 and not line.startswith("-"):
                    raise StackError(f"{unit} exited with {rc}:\n{_tail(log)}")
            else:
                self._spawn(unit, argv, cwd=workdir, env=env, log=log, umask=umask)

    def _exec_argv(self, line: str, env: Mapping[str, str]) -> list[str]:
        line = line.lstrip("-@:+!")
        line = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), line)
        return [self.to_loopback(word) for word in shlex.split(line)]

    def _spawn(
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
        self._state.processes[name] = Process(process.pid, _start_time(process.pid))
        self._save()

    def _wait_listening(self, name: str, port: int, log: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        process = self._children[name]
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"{name} exited with {process.returncode}:\n{_tail(log)}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise StackError(f"{name} is not listening on {port} after {timeout:.0f} s:\n{_tail(log)}")

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
        (self.work / "log").mkdir(exist_ok=True)
        self.state = State(
            name=f"chatsite_loopback_{secrets.token_hex(4)}",
            workers=[free_port() for _ in range(self.worker_count)],
            port=free_port(),
            created_static_root=not STATIC_ROOT.exists(),
        )
        self._save()
        self.shell("compileall")
        self._postgres()
        self._redis()
        self._environment()
        self.manage("migrate")
        self.manage("collectstatic")
        self._units()
        self._nginx()
        self._staff()
        say(f"up: {self.url}/ ({len(self._state.workers)} workers, folder {self.work})")

    def _postgres(self) -> None:
        self.shell("createuser")
        self.shell("createdb")
        output = self.shell("password")
        self._database_url = next(
            line.partition("=")[2]
            for line in output.splitlines()
            if line.startswith("DATABASE_URL=")
        )

    def _redis(self) -> None:
        answer = self.shell("redis").strip()
        if answer != "PONG":
            raise StackError(f"redis-cli ping answered {answer!r}")

    def _environment(self) -> None:
        self.shell("env_file")
        secret = self.shell("secret").strip()
        set_env_lines(
            self.env_file,
            {
                "DJANGO_SECRET_KEY": secret,
                "DATABASE_URL": self._database_url,
                **ENV_LOOPBACK,
                # Two stacks (or a test run and a site) can share one Redis.
                "CHATSITE_REDIS_PREFIX": self.name,
                **self.extra_env,
            },
        )
        text = self.env_file.read_text()
        self.env_file.write_text(self.to_loopback(text))

    def _units(self) -> None:
        """``systemctl enable --now chatsite.target chatsite@PORT.service ...``: what the
        workers require runs once, then every worker starts."""
        worker = read_unit(SYSTEMD_DIR / WORKER_UNIT).get("Unit", {})
        for line in worker.get("Requires", []):
            for unit in line.split():
                self.start_unit(unit)
        names = [f"chatsite@{port}.service" for port in self._state.workers]
        for unit in names:
            self.start_unit(unit)
        for unit, port in zip(names, self._state.workers, strict=True):
            self._wait_listening(unit, port, self.work / "log" / f"{unit}.log")

    def _nginx(self) -> None:
        binary = shutil.which("nginx", path=os.pathsep.join([DEFAULT_PATH, "/usr/sbin"]))
        if binary is None:
            raise StackError("nginx is not installed (step 1 of docs/deploy.md)")
        main = render(
            self.work / "nginx",
            "chatsite.conf",
            workers=self._state.workers,
            port=self._state.port,
            static_root=STATIC_ROOT,
            worker_connections=self.worker_connections,
            edits=self.nginx_edits,
        )
        args = nginx_args(binary, main)
        test = subprocess.run([*args, "-t"], capture_output=True, text=True, timeout=30)
        if test.returncode != 0:
            raise StackError(f"nginx -t failed:\n{test.stderr}")
        log = self.work / "nginx" / "error.log"
        self._spawn("nginx", args, cwd=self.work, env=self._shell_env(), log=log)
        self._wait_listening("nginx", self._state.port, log)

    def _staff(self) -> None:
        self._staff_password = secrets.token_urlsafe(16)
        (self.work / "staff").write_text(self._staff_password)
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
        found: dict[str, Any] = {}
        ready = self.shell("ready").strip()
        expect(ready.endswith(" 200"), f"GET /readyz answered {ready!r}")
        body = json.loads(ready.rsplit(" ", 1)[0])
        expect(body["status"] == "ready", f"GET /readyz says {body}")
        found["ready"] = body["checks"]
        expect(self.shell("metrics").strip() == "200", "GET /metrics is not 200")
        dashboard = self.shell("dashboard").strip()
        login = f"302 {self.url}/admin/login/?next=/dashboard/"
        expect(dashboard == login, f"GET /dashboard/ answered {dashboard!r}, not {login!r}")
        events = sse_events(self.shell("stream"))
        expect_answer(events, "curl's stream")

        # Four more students, each with a session of their own.
        for number in range(4):
            cookies = self._page_cookies()
            found["cookies"] = sorted(cookies)
            with self._request("POST", "/api/chat/stream", chat_body(number), cookies) as resp:
                expect(resp.status == 200, f"chat stream answered {resp.status}")
                kind = resp.getheader("Content-Type", "")
                expect(kind.startswith("text/event-stream"), f"chat stream is {kind}")
                expect(resp.getheader("Content-Encoding") is None, "chat stream is compressed")
                expect_answer(sse_events(resp.read().decode()), "the chat stream")
        found["upstreams"] = self._upstreams_used()
        found["stream_records"] = eventually(self._stream_records)
        found["redis_keys"] = len(redis_keys(self.name))
        expect(found["redis_keys"] > 0, f"no Redis key starts with {self.name}:")
        found["streams_counted"] = eventually(self._metrics_shared)
        self._static_file()
        found["staff_dashboard"] = self._staff_dashboard()
        self.shell("prune")
        found["postgres_connections"] = int(
            self._sql(
                "SELECT count(*) FROM pg_stat_activity"
                f" WHERE datname = '{self.name}' AND pid <> pg_backend_pid()"
            )
        )
        say(f"check passed: {json.dumps(found)}")
        return found

    @contextmanager
    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        cookies: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Iterator[HTTPResponse]:
        """One request through nginx, as the page would send it (cookies, CSRF token)."""
        all_headers = dict(headers or {})
        if cookies:
            all_headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
            if method == "POST" and "csrftoken" in cookies:
                all_headers.setdefault("X-CSRFToken", cookies["csrftoken"])
                all_headers.setdefault("Origin", self.url)
        if body is not None:
            all_headers.setdefault("Content-Type", "application/json")
        connection = HTTPConnection("127.0.0.1", self._state.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=all_headers)
            yield connection.getresponse()
        finally:
            connection.close()

    def _page_cookies(self) -> dict[str, str]:
        """GET / hands out the session and the CSRF token, neither of them Secure on plain
        HTTP (a browser would drop a Secure cookie here, and every question would fail CSRF)."""
        with self._request("GET", "/") as resp:
            expect(resp.status == 200, f"GET / answered {resp.status}")
            resp.read()
            jar: SimpleCookie = SimpleCookie()
            for header in resp.headers.get_all("Set-Cookie") or []:
                jar.load(header)
        expect({"sessionid", "csrftoken"} <= set(jar), f"GET / set {sorted(jar)}")
        for name in ("sessionid", "csrftoken"):
            expect(not jar[name]["secure"], f"{name} is Secure on plain HTTP (CHATSITE_TLS?)")
        return {name: morsel.value for name, morsel in jar.items()}

    def _stream_records(self) -> int:
        """Each stream's timings are in PostgreSQL (written once it has ended)."""
        count = int(self._sql("SELECT count(*) FROM assistant_streamrecord"))
        expect(count >= 5, f"{count} stream records, not 5")
        return count

    def _upstreams_used(self) -> list[str]:
        """Every worker answered through nginx (its access log's up= field)."""
        log = (self.work / "nginx" / "access.log").read_text()
        used = sorted(set(re.findall(r" up=127\.0\.0\.1:(\d+) ", log)))
        wanted = sorted(str(port) for port in self._state.workers)
        expect(used == wanted, f"nginx used workers {used}, not {wanted}")
        return used

    def _metrics_shared(self) -> float:
        """Each worker's own /metrics (as Prometheus scrapes it) counts every worker's streams:
        the shared PROMETHEUS_MULTIPROC_DIR of the units."""
        totals = []
        for port in self._state.workers:
            connection = HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                connection.request("GET", "/metrics")
                resp = connection.getresponse()
                text = resp.read().decode()
            finally:
                connection.close()
            expect(resp.status == 200, f"worker {port}: /metrics answered {resp.status}")
            totals.append(metric_total(text, "ai_streams_total"))
        expect(len(set(totals)) == 1, f"the workers count different totals: {totals}")
        expect(totals[0] >= 5, f"the workers counted {totals[0]} streams, not 5")
        return totals[0]

    def _static_file(self) -> None:
        """nginx serves /static/ from what collectstatic put in STATIC_ROOT."""
        name = "chatsite/chat.js"
        with self._request("GET", f"/static/{name}") as resp:
            body = resp.read()
            expect(resp.status == 200, f"/static/{name} answered {resp.status}")
            # The app's middleware sends a Referrer-Policy; nginx alone does not.
            expect(resp.getheader("Referrer-Policy") is None, f"/static/{name} came from the app")
        expect(body == (STATIC_DIR / name).read_bytes(), f"/static/{name} differs from the source")

    def _staff_dashboard(self) -> int:
        """The account of `createsuperuser` logs in through nginx and sees the dashboard."""
        password = self._staff_password or (self.work / "staff").read_text()
        with self._request("GET", "/admin/login/?next=/dashboard/") as resp:
            page = resp.read().decode()
            jar: SimpleCookie = SimpleCookie()
            for header in resp.headers.get_all("Set-Cookie") or []:
                jar.load(header)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        expect(token is not None and "csrftoken" in jar, "the login page has no CSRF token")
        assert token is not None
        cookies = {"csrftoken": jar["csrftoken"].value}
        form = urlencode(
            {
                "csrfmiddlewaretoken": token.group(1),
                "username": STAFF["username"],
                "password": password,
                "next": "/dashboard/",
            }
        ).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Origin": self.url}
        with self._request("POST", "/admin/login/", form, cookies, headers) as resp:
            resp.read()
            expect(resp.status == 302, f"logging in answered {resp.status}")
            expect(resp.getheader("Location") == "/dashboard/", "logging in went elsewhere")
            for header in resp.headers.get_all("Set-Cookie") or []:
                jar.load(header)
        cookies = {name: morsel.value for name, morsel in jar.items()}
        with self._request("GET", "/dashboard/", cookies=cookies) as resp:
            resp.read()
            expect(resp.status == 200, f"the staff dashboard answered {resp.status}")
            return resp.status

    def _sql(self, query: str) -> str:
        result = subprocess.run(
            ["psql", "-d", self.name, "-Atc", query],
            env=self._shell_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0:
            raise StackError(f"psql: {result.stderr}")
        return result.stdout.strip()

    # --- down

    def down(self) -> None:
        """Undo whatever ``up`` did, whatever state it stopped in; safe to run twice."""
        if self.state is None:
            say(f"nothing to tear down in {self.work}")
            return
        problems = []
        # nginx first, so no request reaches a worker that is going away.
        for name in sorted(self._state.processes, key=lambda n: n != "nginx"):
            try:
                self._stop(name, self._state.processes[name])
            except OSError as exc:
                problems.append(f"stopping {name}: {exc}")
        env = self._shell_env()
        for command in (
            ["dropdb", "--if-exists", "--force", self.name],
            ["dropuser", "--if-exists", self.name],
        ):
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
            if result.returncode != 0:
                problems.append(f"{shlex.join(command)}: {result.stderr.strip()}")
        try:
            delete_redis_keys(self.name)
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"deleting Redis keys {self.name}:*: {exc}")
        if self._state.created_static_root:
            shutil.rmtree(STATIC_ROOT, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.state = None
        if problems:
            raise StackError("teardown incomplete:\n" + "\n".join(problems))
        say("down")

    def _stop(self, name: str, process: Process) -> None:
        child = self._children.pop(name, None)
        if process.started is not None and _start_time(process.pid) != process.started:
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
            elif _start_time(process.pid) != process.started:
                return
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
        if child is not None:
            child.wait(10)


def eventually[T](probe: Callable[[], T], timeout: float = 10) -> T:
    """``probe()`` once it stops raising StackError; its last error after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except StackError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StackError(message)


def chat_body(number: int) -> bytes:
    message = f"[scripted tokens=3 ttft_ms=5 itl_ms=5] Question {number}"
    return json.dumps({"message": message, "conversation": None}).encode()


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) of each event in an event stream's text; comments skipped."""
    events = []
    for block in re.split(r"\r?\n\r?\n", text):
        name, data = "message", []
        for line in block.splitlines():
            if line.startswith(":") or not line:
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
        if data or name != "message":
            events.append((name, "\n".join(data)))
    return events


def expect_answer(events: Sequence[tuple[str, str]], what: str) -> None:
    names = [name for name, _ in events]
    expect(bool(names) and names[0] == "meta", f"{what} did not start with meta: {names}")
    expect("token" in names, f"{what} has no token: {names}")
    expect(names[-1] == "done", f"{what} did not end with done: {names}")


def metric_total(text: str, name: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus text exposition."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )


def _redis_cli(*args: str) -> str:
    host, port = REDIS
    result = subprocess.run(
        ["redis-cli", "-h", host, "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def redis_keys(prefix: str) -> list[str]:
    """Every key the stack's workers wrote: the cache's and the channel layer's."""
    return [k for k in _redis_cli("--scan", "--pattern", f"{prefix}:*").splitlines() if k]


def delete_redis_keys(prefix: str) -> None:
    keys = redis_keys(prefix)
    for start in range(0, len(keys), 500):
        _redis_cli("DEL", *keys[start : start + 500])


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "check", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    parser.add_argument("--workers", type=int, default=2, help="Daphne workers (up only)")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a line of the environment file, after the loopback's own (up only; repeatable)",
    )
    parser.add_argument(
        "--worker-connections",
        type=int,
        default=WORKER_CONNECTIONS,
        help=f"nginx's worker_connections (up only; default {WORKER_CONNECTIONS})",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if bad := [item for item in args.env if "=" not in item]:
        parser.error(f"--env wants NAME=VALUE, not {bad[0]!r}")
    env = dict(item.split("=", 1) for item in args.env)
    try:
        if args.action == "up":
            stack = LoopbackStack(
                args.dir,
                workers=args.workers,
                env=env,
                worker_connections=args.worker_connections,
            )
            try:
                stack.up()
            except BaseException:
                stack.down()
                raise
            print(stack.url)
        else:
            stack = LoopbackStack.load(args.dir)
            if args.action == "check":
                print(json.dumps(stack.check(), indent=2))
            else:
                stack.down()
    except StackError as exc:
        print(f"{args.action} failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
