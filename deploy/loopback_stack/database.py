"""The stack's PostgreSQL role and database: made by the guide's commands, dropped by ``down``.

The server is the one at 127.0.0.1:5432 that the tests use too (trust authentication, superuser
``postgres``), reached over TCP as PGUSER where the guide says ``sudo -u postgres``. Each stack
has a role and database of its own, named for it, so that stacks and test runs never share
rows and ``down`` can drop exactly what ``up`` made.
"""

import shlex
import subprocess
from collections.abc import Callable, Mapping

from .report import StackError

POSTGRES = {"PGHOST": "127.0.0.1", "PGPORT": "5432", "PGUSER": "postgres"}


def create(shell: Callable[[str], str]) -> str:
    """The guide's createuser, createdb and password steps; the DATABASE_URL they print."""
    shell("createuser")
    shell("createdb")
    output = shell("password")
    return next(
        line.partition("=")[2] for line in output.splitlines() if line.startswith("DATABASE_URL=")
    )


def sql(database: str, query: str, env: Mapping[str, str]) -> str:
    """``query``'s result in ``database`` as psql prints it unaligned."""
    result = subprocess.run(
        ["psql", "-d", database, "-Atc", query],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if result.returncode != 0:
        raise StackError(f"psql: {result.stderr}")
    return result.stdout.strip()


def drop(name: str, env: Mapping[str, str]) -> list[str]:
    """Drop the database and the role ``name`` if they exist; what went wrong, if anything."""
    problems = []
    for command in (
        ["dropdb", "--if-exists", "--force", name],
        ["dropuser", "--if-exists", name],
    ):
        result = subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            problems.append(f"{shlex.join(command)}: {result.stderr.strip()}")
    return problems
