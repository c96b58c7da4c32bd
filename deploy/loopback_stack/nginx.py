"""nginx with the shipped site, deploy/nginx/, rendered for loopback ports and a folder of its own.

The shipped files name example ports (80, 8001 and 8002) and production paths; a rendering
replaces exactly those (each must still occur, so an edit to the shipped files cannot silently
stop being tested) and wraps the site in the smallest main configuration, which keeps all that
nginx writes in the run's folder. tests/deploy/test_nginx.py renders the same files with
``render``; a test that means to change them says so with ``edits``.
"""

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .layout import DEFAULT_PATH, NGINX_DIR, STATIC_DIR
from .processes import Supervisor
from .report import StackError

# What the shipped files use as examples, and so what a rendering replaces (each must occur).
EXAMPLE_WORKERS = ("server 127.0.0.1:8001;", "server 127.0.0.1:8002;")
# chatsite-servers.conf's uvicorn pool (EXAMPLE_WORKERS are its Daphne pool).
EXAMPLE_UVICORN_WORKERS = ("server 127.0.0.1:8011;", "server 127.0.0.1:8012;")
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


def _replace_examples(texts: dict[Path, str], site: str, replacements: dict[str, str]) -> None:
    for old in replacements:
        assert any(old in text for text in texts.values()), f"{old!r} is no longer in {site}"
    # One pass, so that a port written by one replacement is never replaced again.
    pattern = re.compile("|".join(re.escape(old) for old in replacements))
    for path, text in texts.items():
        texts[path] = pattern.sub(lambda m: replacements[m.group()], text)


def render(
    work: Path,
    site: str,
    *,
    workers: Sequence[int],
    port: int,
    edits: Sequence[Edit] = (),
    static_root: Path = STATIC_DIR,
    worker_connections: int = WORKER_CONNECTIONS,
    uvicorn_workers: Sequence[int] = (),
) -> Path:
    """Copy deploy/nginx into ``work`` for this run and wrap ``site`` in a main config.

    The upstreams get one ``server`` line per port in ``workers`` (in chatsite-servers.conf,
    the Daphne pool's; ``uvicorn_workers`` are the uvicorn pool's, which that site needs);
    nginx listens on 127.0.0.1:``port`` and serves /static/ from ``static_root``, its one
    worker process with ``worker_connections``. Nothing else changes but ``edits``."""
    conf = work / "conf"
    shutil.copytree(NGINX_DIR, conf)
    files = [conf / site, *sorted((conf / "snippets").glob("*.conf"))]
    texts = {path: path.read_text() for path in files}
    pools = [(EXAMPLE_WORKERS, workers)]
    if uvicorn_workers or EXAMPLE_UVICORN_WORKERS[0] in texts[conf / site]:
        pools.append((EXAMPLE_UVICORN_WORKERS, uvicorn_workers))
    replacements = {
        EXAMPLE_LISTEN[0]: f"listen 127.0.0.1:{port};",
        EXAMPLE_LISTEN[1]: "",
        EXAMPLE_STATIC_ROOT: f"{static_root}/",
        EXAMPLE_ACCESS_LOG: str(work / "access.log"),
    }
    for examples, ports in pools:
        if not ports:
            raise ValueError(f"{site} needs the ports of its workers for {examples[0]!r}")
        # The first worker replaces the first example line, every other one the second.
        first, *others = (f"server 127.0.0.1:{worker};" for worker in ports)
        replacements |= {examples[0]: first, examples[1]: "\n    ".join(others)}
    _replace_examples(texts, site, replacements)
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
    """The command line of nginx with the main config ``render`` wrote."""
    work = main.parent.parent
    return [binary, "-p", f"{work}/", "-c", str(main), "-e", str(work / "error.log")]


def start_nginx(
    supervisor: Supervisor,
    work: Path,
    *,
    site: str,
    workers: Sequence[int],
    uvicorn_workers: Sequence[int],
    port: int,
    static_root: Path,
    worker_connections: int,
    edits: Sequence[Edit],
    env: dict[str, str],
) -> None:
    """Render ``site`` into ``work`` (``render``), test the configuration (``nginx -t``), start
    nginx and wait until it listens on ``port``."""
    binary = shutil.which("nginx", path=os.pathsep.join([DEFAULT_PATH, "/usr/sbin"]))
    if binary is None:
        raise StackError("nginx is not installed (step 1 of docs/deploy.md)")
    main = render(
        work,
        site,
        workers=workers,
        uvicorn_workers=uvicorn_workers,
        port=port,
        static_root=static_root,
        worker_connections=worker_connections,
        edits=edits,
    )
    args = nginx_args(binary, main)
    test = subprocess.run([*args, "-t"], capture_output=True, text=True, timeout=30)
    if test.returncode != 0:
        raise StackError(f"nginx -t failed:\n{test.stderr}")
    log = work / "error.log"
    supervisor.spawn("nginx", args, cwd=work.parent, env=env, log=log)
    supervisor.wait_listening("nginx", port, log)
