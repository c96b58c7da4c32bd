"""deploy/systemd's units run as systemd would run them, as far as the chatsite units go.

A host starts the site with ``systemctl enable --now``; the loopback run has no systemd of its
own to ask, so it reads the same unit files and does what they say: the environment (Environment=,
EnvironmentFile=, UnsetEnvironment=), the working directory, the umask, RuntimeDirectory=,
ExecStartPre= and ExecStart=, a oneshot run to the end and anything else kept running. Only
what the shipped units use is supported; anything else is an error rather than a guess.
"""

import argparse
import re
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

from assistant.worker import SERVERS

from .envfile import read_env_file
from .layout import DEFAULT_PATH, ROOT, SYSTEMD_DIR, Layout
from .processes import Supervisor
from .report import StackError, say, tail

#: The worker unit template of each server a site can run on (``assistant.worker.SERVERS``).
WORKER_UNITS = dict(zip(SERVERS, ("chatsite@.service", "chatsite-uvicorn@.service"), strict=True))
#: A site with a pool of each (deploy/nginx/chatsite-servers.conf): half its workers Daphne's.
BOTH = "both"
SERVER_CHOICES = (*WORKER_UNITS, BOTH)


def add_server_option(parser: argparse.ArgumentParser) -> None:
    """``--server daphne|uvicorn|both``: the workers' unit, for every command that brings a stack
    up."""
    parser.add_argument(
        "--server",
        choices=SERVER_CHOICES,
        default="daphne",
        help="the workers' server: chatsite@PORT (Daphne), chatsite-uvicorn@PORT, or both: "
        "half the workers each, the students split between them (chatsite-servers.conf)",
    )


def worker_servers(workers: list[int], server: str) -> dict[int, str]:
    """The server of each worker port: ``server``'s, or with ``both`` the first half Daphne's
    (at least one of each)."""
    if server != BOTH:
        return dict.fromkeys(workers, server)
    if len(workers) < 2:
        raise ValueError("both servers need at least two workers")
    half = len(workers) // 2
    return {port: "daphne" if i < half else "uvicorn" for i, port in enumerate(workers)}


Section = dict[str, list[str]]


def _logical_lines(path: Path) -> list[str]:
    """A unit file's lines, continued lines joined and comments inside them skipped."""
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
    return lines


def read_unit(path: Path, instance: str = "") -> dict[str, Section]:
    """The sections of a unit file: each key's values in order, ``%i`` filled with
    ``instance``. Continued lines are joined, comments inside them skipped, as systemd does;
    an empty assignment resets the key."""
    sections: dict[str, Section] = {}
    current: Section = {}
    for line in _logical_lines(path):
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


def service_env(service: Mapping[str, list[str]], layout: Layout) -> dict[str, str]:
    """A service's environment as systemd builds it: a few basics, Environment=, then
    EnvironmentFile= (which wins), then UnsetEnvironment=."""
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "HOME": str(layout.work)}
    for line in service.get("Environment", []):
        for word in shlex.split(line):
            name, _, value = word.partition("=")
            env[name] = value
    for entry in service.get("EnvironmentFile", []):
        optional = entry.startswith("-")
        path = Path(layout.to_loopback(entry.removeprefix("-")))
        if path.exists() or not optional:
            env.update(read_env_file(path))
    for line in service.get("UnsetEnvironment", []):
        for name in line.split():
            env.pop(name, None)
    return {name: layout.to_loopback(value) for name, value in env.items()}


def _exec_argv(line: str, env: Mapping[str, str], layout: Layout) -> list[str]:
    line = line.lstrip("-@:+!")
    line = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), line)
    return [layout.to_loopback(word) for word in shlex.split(line)]


def start_unit(unit: str, layout: Layout, supervisor: Supervisor) -> None:
    """Start ``unit`` (``name.service`` or ``name@instance.service``) as systemd would, with
    the stack's paths: a oneshot runs to the end, anything else keeps running."""
    stem, _, suffix = unit.rpartition(".")
    template, at, instance = stem.partition("@")
    path = SYSTEMD_DIR / (f"{template}@.{suffix}" if at else unit)
    service = read_unit(path, instance).get("Service", {})
    for name in service.get("RuntimeDirectory", []):
        mode = int(service.get("RuntimeDirectoryMode", ["0755"])[-1], 8)
        (layout.work / "run" / name).mkdir(mode=mode, parents=True, exist_ok=True)
    env = service_env(service, layout)
    workdir = layout.to_loopback(service.get("WorkingDirectory", [str(ROOT)])[-1])
    umask = int(service.get("UMask", ["0022"])[-1], 8)
    commands = service.get("ExecStartPre", []) + service.get("ExecStart", [])
    kind = service.get("Type", ["simple"])[-1]
    log = layout.log(unit)
    for number, line in enumerate(commands, 1):
        argv = _exec_argv(line, env, layout)
        say(f"{unit}: {shlex.join(argv)}")
        if kind == "oneshot" or number < len(commands):
            with log.open("ab") as out:
                rc = subprocess.run(
                    argv, cwd=workdir, env=env, stdout=out, stderr=out, umask=umask
                ).returncode
            if rc != 0 and not line.startswith("-"):
                raise StackError(f"{unit} exited with {rc}:\n{tail(log)}")
        else:
            supervisor.spawn(unit, argv, cwd=workdir, env=env, log=log, umask=umask)


def start_site(
    workers: list[int], layout: Layout, supervisor: Supervisor, server: str = "daphne"
) -> None:
    """``systemctl enable --now chatsite.target chatsite@PORT.service ...`` (``server``
    uvicorn: ``chatsite-uvicorn@PORT.service``; both: some of each, ``worker_servers``): what
    the workers require runs once, then every worker starts and is waited for."""
    servers = worker_servers(workers, server)
    required: list[str] = []
    for template in {WORKER_UNITS[name] for name in servers.values()}:
        for line in read_unit(SYSTEMD_DIR / template).get("Unit", {}).get("Requires", []):
            required += [unit for unit in line.split() if unit not in required]
    for unit in required:
        start_unit(unit, layout, supervisor)
    names = [WORKER_UNITS[servers[port]].replace("@.", f"@{port}.") for port in workers]
    for unit in names:
        start_unit(unit, layout, supervisor)
    for unit, port in zip(names, workers, strict=True):
        supervisor.wait_listening(unit, port, layout.log(unit))
