"""The production profile for benchmarks/capacity.py (``--through nginx``): each server behind
nginx, as it is deployed.

* chatsite (``chatsite`` on Daphne, ``chatsite-uvicorn`` under uvicorn[standard]): the loopback
  stack (deploy/loopback_stack) with the shipped site, deploy/nginx/chatsite.conf, ``--workers``
  workers, PostgreSQL and Redis. Only what this benchmark's crowd needs is changed: nginx's
  per-address request rates (its students ask again the moment an answer ends, as in
  benchmarks/load.py) and the workers' caps on streams per worker and per address and on a
  session's questions a minute. Each student has a session of its own (a page load each), and
  a class of 60 shares a loopback address, as behind a school's NAT. A question says what the
  student's page showed of their class (``"class"``, ``"teachers_read"``), as the page does.
* the peer (``uvicorn``: uvicorn[standard] + sse-starlette; ``bare``): one process behind an
  nginx with the same main configuration and what chatsite's stream location does on the way
  (HTTP/1.1 upstream with keep-alive, no buffering, no gzip, ``tcp_nodelay``, an access log line
  per request).

nginx and the servers are pinned to core 0, the load generator to core 1. PostgreSQL and Redis
are the machine's own services and are not pinned: their CPU is counted with the box's.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from assistant.benchmarking.ports import free_port
from assistant.benchmarking.sampling import PERF_ENV
from benchmarks.added_latency import build_request, peer_start
from benchmarks.load import CROWD_RATES, Meter
from deploy.loopback_stack import LoopbackStack
from deploy.loopback_stack.nginx import MAIN_CONF, nginx_args
from deploy.loopback_stack.processes import Supervisor
from deploy.loopback_stack.state import Process

QUESTION = b'{"message": "What is photosynthesis?"}'
#: What the students' page shows of the class (``frontend/templates/assistant/chat.html``).
PAGE_CLASS = re.compile(r'data-class="([^"]*)"\s+data-teachers-read="(true|false)"')
#: The roles of the box's CPU: nginx, the servers, and the services chatsite uses.
BOX_ROLES = ("nginx", "server", "PostgreSQL", "Redis")

PEER_SITE = """\
upstream capacity_peer {{
    server 127.0.0.1:{upstream};
    keepalive 32;
}}
server {{
    listen 127.0.0.1:{port};
    access_log {work}/access.log;
    location / {{
        proxy_pass http://capacity_peer;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $http_host;
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_buffering off;
        proxy_cache off;
        gzip off;
        tcp_nodelay on;
        proxy_read_timeout 1h;
    }}
}}
"""


@dataclass
class Box:
    """A server behind nginx: where the students ask, what they send, and whose CPU counts."""

    #: The server's name (``capacity.py --servers``).
    name: str
    port: int
    #: The processes of the box (pid -> role; their children count too).
    roles: dict[int, str]
    #: The PostgreSQL database whose backends count (chatsite's), if any.
    database: str = ""
    #: Makes the request of student number ``i`` (a page load, for a session of their own).
    ask: Callable[[int], bytes] | None = None
    requests: list[bytes] = field(default_factory=list)
    #: Whether it has answered a few questions already (imports, pools, prepared statements).
    warm: bool = False

    def requests_for(self, students: int) -> list[bytes]:
        """One request per student, made as more students are needed."""
        while len(self.requests) < students:
            if self.ask is None:
                raise RuntimeError("this box has one request for everybody")
            self.requests.append(self.ask(len(self.requests)))
        return self.requests[:students]

    def meter(self) -> Meter:
        return Meter(self.roles, self.database)


class BoxClock:
    """The CPU seconds of ``box`` (``BOX_ROLES``) since ``start``."""

    def __init__(self, box: Box) -> None:
        self.meter = box.meter()
        #: CPU seconds by role over the last level.
        self.spent: dict[str, float] = {}

    def start(self) -> None:
        self.meter.start()

    def stop(self) -> float:
        reading = self.meter.stop(digits=3)
        self.spent = {role: reading.get(role, 0.0) for role in BOX_ROLES}
        return sum(self.spent.values())


def family(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo += children.get(current, [])
    return found


def pin_box(box: Box, cores: set[int]) -> None:
    """Every thread of the box's processes, and of their children, onto ``cores``."""
    for pid in box.roles:
        for member in family(pid):
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{member}/task").iterdir():
                    os.sched_setaffinity(int(task.name), cores)


def page_question(page: str) -> bytes:
    """``QUESTION`` with what ``page`` (the students' page) showed of their class."""
    shown = PAGE_CLASS.search(page)
    if shown is None:
        raise RuntimeError("the page does not say what it showed of the class")
    question = json.loads(QUESTION)
    question["class"] = shown.group(1) or None
    question["teachers_read"] = shown.group(2) == "true"
    return json.dumps(question).encode()


@contextlib.contextmanager
def chatsite_box(name: str, args: Any, folder: Path) -> Iterator[Box]:
    """chatsite's loopback stack (see the module docstring)."""
    env = {
        "CHATSITE_SCRIPTED_TTFT_MS": str(args.ttft_ms),
        "CHATSITE_SCRIPTED_TOKENS": str(args.tokens),
        "CHATSITE_SCRIPTED_ITL_MS": str(args.itl_ms),
        "CHATSITE_MAX_STREAMS": "0",
        "CHATSITE_STREAMS_PER_ADDRESS": "0",
        "CHATSITE_CHAT_RATE": "100000000",
        "CHATSITE_NEW_SESSIONS_PER_MINUTE": "100000",
        # What a sampler needs of the workers (the environment file is all they read).
        **{name: value for name, value in os.environ.items() if name in PERF_ENV},
        **dict(args.chatsite_env),
    }
    server = "uvicorn" if name == "chatsite-uvicorn" else "daphne"
    with LoopbackStack(
        folder / name,
        workers=args.workers,
        server=server,
        env=env,
        worker_connections=3 * args.most + 512,
        nginx_edits=CROWD_RATES,
    ) as stack:
        assert stack.state is not None
        roles = {
            process.pid: "nginx" if label == "nginx" else "server"
            for label, process in stack.state.processes.items()
        }
        browser = httpx.Client(base_url=stack.url, timeout=30)

        def ask(student: int) -> bytes:
            browser.cookies.clear()
            page = browser.get("/")
            page.raise_for_status()
            cookies = "; ".join(f"{c.name}={c.value}" for c in browser.cookies.jar)
            return build_request(
                stack.port, page_question(page.text), cookies, page.cookies["csrftoken"]
            )

        try:
            yield Box(name=name, port=stack.port, roles=roles, database=stack.name, ask=ask)
        finally:
            browser.close()


@contextlib.contextmanager
def peer_box(name: str, args: Any, folder: Path) -> Iterator[Box]:
    """The peer (or the bare server) behind an nginx of its own (see the module docstring)."""
    process, upstream = peer_start(name, args.ttft_ms, args.tokens, args.itl_ms)
    work = folder / f"{name}-nginx"
    (work / "conf").mkdir(parents=True)
    port = free_port()
    site = work / "conf" / "peer.conf"
    site.write_text(PEER_SITE.format(upstream=upstream, port=port, work=work))
    main = work / "conf" / "nginx.conf"
    user = "user root;\n" if os.geteuid() == 0 else ""
    main.write_text(
        MAIN_CONF.format(user=user, work=work, site=site, worker_connections=3 * args.most + 512)
    )
    binary = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if binary is None:
        raise RuntimeError("nginx is not installed")
    command = nginx_args(binary, main)
    subprocess.run([*command, "-t"], check=True, capture_output=True, timeout=30)
    started: dict[str, Process] = {}
    supervisor = Supervisor(lambda label, p: started.__setitem__(label, p))
    try:
        supervisor.spawn("nginx", command, cwd=work, env=os.environ, log=work / "error.log")
        supervisor.wait_listening("nginx", port, work / "error.log")
        request = build_request(port, QUESTION)
        nginx = started["nginx"].pid
        yield Box(
            name=name,
            port=port,
            roles={nginx: "nginx", process.pid: "server"},
            requests=[request],
        )
    finally:
        if "nginx" in started:
            supervisor.stop("nginx", started["nginx"])
        process.terminate()
        process.wait()


def box_start(name: str, args: Any, folder: Path) -> contextlib.AbstractContextManager[Box]:
    if name.startswith("chatsite"):
        return chatsite_box(name, args, folder)
    return peer_box(name, args, folder)
