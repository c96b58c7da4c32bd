"""The commands of docs/deploy.md, written once: the guide shows them, the loopback run runs them.

Each is a template. ``{name}`` is filled from ``PRODUCTION`` for the guide and from the stack's
own values on loopback (``LoopbackStack.values``); any other brace (curl's %{http_code}) is left
alone. tests/deploy/test_loopback_stack.py checks that the guide shows every command of
``guide_commands`` as written, so what is checked here cannot drift from what an operator reads.
"""

import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .database import POSTGRES
from .layout import DEFAULT_PATH, ROOT, Layout
from .report import StackError, say
from .units import service_env

# Shell commands of docs/deploy.md.
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
    "prune": "manage prune --dry-run --days 30",
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


def fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` of ``values`` replaced; other braces untouched."""
    return re.sub(
        r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template, flags=re.ASCII
    )


def guide_commands() -> list[str]:
    """Every command of docs/deploy.md the loopback run performs, as the guide writes it."""
    return [
        MANAGE_FUNCTION,
        *(fill(c, PRODUCTION) for c in [*COMMANDS.values(), *MANAGE_COMMANDS.values()]),
    ]


def shell_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment, as sudo would give: no DATABASE_URL or settings of the caller's.
    ``postgres`` on loopback is reached over TCP as PGUSER instead of `sudo -u postgres`."""
    return {
        "PATH": os.environ.get("PATH", DEFAULT_PATH),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        **POSTGRES,
        **extra,
    }


def run_command(
    key: str, values: Mapping[str, str], home: Path, *, timeout: float, env: Mapping[str, str]
) -> str:
    """Run the guide's command ``key`` filled with ``values`` in bash; its standard output."""
    command = fill(COMMANDS[key], values)
    say(f"$ {command}")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=ROOT,
        env=shell_env(home, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise StackError(f"{key} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def run_manage(key: str, values: Mapping[str, str], layout: Layout, env: Mapping[str, str]) -> str:
    """Run the guide's ``manage ...`` command ``key`` the way its systemd-run does."""
    command = fill(MANAGE_COMMANDS[key], values)
    say(f"$ {command}")
    body = "\n".join(MANAGE_FUNCTION.splitlines()[1:-1]).replace("\\\n", " ")
    words = shlex.split(layout.to_loopback(body))
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
        env={**service_env(service, layout), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise StackError(f"{command} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout
