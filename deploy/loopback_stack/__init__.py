"""docs/deploy.md performed on loopback, as an ordinary user, then torn down.

    .venv/bin/python -m deploy.loopback_stack up [--workers N] [--server daphne|uvicorn] [--dir DIR]
        [--env NAME=VALUE ...]
    .venv/bin/python -m deploy.loopback_stack check [--dir DIR]
    .venv/bin/python -m deploy.loopback_stack down [--dir DIR]

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
HTTP (CHATSITE_TLS=0) and the scripted engine instead of a model. The guide's commands are in
``guide`` (``COMMANDS``, ``MANAGE_FUNCTION`` and ``MANAGE_COMMANDS``), filled from
``PRODUCTION`` for the guide and from ``LoopbackStack.values()`` here;
tests/deploy/test_loopback_stack.py checks that the guide shows each of them as written.

The modules, in the order ``up`` uses them: ``layout`` (where things are), ``guide`` (the
guide's commands), ``database``, ``redis_db``, ``envfile``, ``units`` and ``processes`` (the
systemd units), ``nginx``, then ``checks`` and ``client`` for ``check``; ``stack`` composes them.
"""

from .database import POSTGRES
from .guide import COMMANDS, MANAGE_COMMANDS, MANAGE_FUNCTION, PRODUCTION, guide_commands
from .layout import DEFAULT_DIR, NGINX_DIR, ROOT, STATIC_DIR, STATIC_ROOT, SYSTEMD_DIR
from .nginx import WORKER_CONNECTIONS, Edit, nginx_args, render
from .redis_db import REDIS
from .report import StackError
from .stack import LoopbackStack
from .state import Process, State
from .units import WORKER_UNITS, add_server_option

__all__ = [
    "COMMANDS",
    "DEFAULT_DIR",
    "MANAGE_COMMANDS",
    "MANAGE_FUNCTION",
    "NGINX_DIR",
    "POSTGRES",
    "PRODUCTION",
    "REDIS",
    "ROOT",
    "STATIC_DIR",
    "STATIC_ROOT",
    "SYSTEMD_DIR",
    "WORKER_CONNECTIONS",
    "WORKER_UNITS",
    "Edit",
    "LoopbackStack",
    "Process",
    "StackError",
    "State",
    "add_server_option",
    "guide_commands",
    "nginx_args",
    "render",
]
