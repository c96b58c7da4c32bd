"""Test helpers: Daphne with the tests' settings, nginx, a browser-like HTTP client, raw sockets
and an SSE reader that stamps arrival times.

The servers themselves (Daphne, the model process) live in ``assistant.benchmarking.servers``,
shared with the benchmarks; what only tests want of them is added here."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import pytest

from assistant.benchmarking import SSEParser, servers
from assistant.benchmarking.ports import accepts, free_port

# Real servers on loopback, shared with benchmarks and tooling; the tests import them from here.
from assistant.benchmarking.servers import (  # noqa: F401
    ROOT,
    LiveServer,
    ModelHost,
    database_env,
    short_socket_path,
    terminate,
)

# preexec_fn for every server a test starts: the kernel kills it when the test process dies,
# however that dies (a segfault in native code, a SIGKILL, a timeout), so none outlives its run.
from assistant.modelhost.supervisor import die_with_parent

#: What every test server changes from the settings' defaults (under the test's own ``env``).
TEST_SETTINGS = {
    # A client that leaves stops its answer at once, unless a test turns resuming on; and
    # one test session asks far more than a student would in a minute.
    "CHATSITE_RESUME_GRACE_S": "0",
    "CHATSITE_CHAT_RATE": "100000",
    # Every test client shares 127.0.0.1, unless a test gives it its own address.
    "CHATSITE_NEW_SESSIONS_PER_MINUTE": "100000",
    # A server stopped at the end of a module may have a stream a test left open: it drains
    # for at most this long (tests/deploy/test_drain.py sets its own).
    "CHATSITE_DRAIN_S": "2",
}


def start_daphne(
    *,
    workdir: Path,
    db_path: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    uvicorn: bool = False,
) -> LiveServer:
    """``assistant.benchmarking.servers.start_daphne`` with ``TEST_SETTINGS`` under ``env``
    (``uvicorn``: the same application under uvicorn instead)."""
    return servers.start_daphne(
        workdir=workdir,
        db_path=db_path,
        env={**TEST_SETTINGS, **(env or {})},
        port=port,
        uvicorn=uvicorn,
    )


#: The machine's Redis (every machine this runs on has one, CI's included).
REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_clients_named(name: str) -> list[dict[str, str]]:
    """The connections Redis's ``CLIENT LIST`` shows under the client name ``name``."""
    import redis

    with redis.Redis.from_url(REDIS_URL) as admin:
        return [c for c in admin.client_list() if c["name"] == name]


class StubReactor:
    """Enough of a Twisted reactor for descriptors that are never really polled (none is
    installed)."""

    def addReader(self, _: object) -> None: ...

    def removeReader(self, _: object) -> None: ...

    def addWriter(self, _: object) -> None: ...

    def removeWriter(self, _: object) -> None: ...


@dataclass
class NginxServer(LiveServer):
    """nginx as a ``LiveServer``: ``ChatClient`` and ``raw_post`` work through it."""

    access_log: Path = Path(os.devnull)

    def access_lines(self) -> list[str]:
        return self.access_log.read_text().splitlines() if self.access_log.exists() else []


def start_nginx(
    binary: str, work: Path, site: str, workers: Any, edits: Any = (), uvicorn_workers: Any = ()
) -> NginxServer:
    """nginx serving deploy/nginx's ``site`` on a free port in front of ``workers``' ports
    (and ``uvicorn_workers``' for chatsite-servers.conf's uvicorn pool), rendered into ``work``
    (``deploy.loopback_stack.render``, with ``edits``)."""
    from deploy.loopback_stack import nginx_args, render

    port = free_port()
    main = render(
        work, site, workers=workers, port=port, edits=edits, uvicorn_workers=uvicorn_workers
    )
    process = subprocess.Popen(
        nginx_args(binary, main),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,
    )
    server = NginxServer(
        f"http://127.0.0.1:{port}",
        port,
        process,
        events_file=work / "no-engine-here.jsonl",
        log_file=work / "error.log",
        access_log=work / "access.log",
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited with {process.returncode}:\n{server.log()}")
        if accepts(port):
            return server
        time.sleep(0.02)
    server.stop()
    raise RuntimeError(f"nginx did not start:\n{server.log()}")


@dataclass
class Event:
    event: str
    data: str
    id: str | None
    at: float = 0.0

    def json(self) -> Any:
        return json.loads(self.data)


class SSEReader:
    """The project's incremental parser (``assistant.benchmarking.SSEParser``), stamping each
    event with the time its frame arrived."""

    def __init__(self) -> None:
        self.parser = SSEParser()

    def feed(self, chunk: bytes, at: float | None = None) -> list[Event]:
        stamp = at or time.monotonic()
        return [Event(e.event, e.data, e.id, stamp) for e in self.parser.feed(chunk)]


class ChatClient:
    """An HTTP client that behaves like the page: GET / for cookies, then POST with the token.
    ``source`` is the loopback address it connects from (127.0.0.0/8 is all this host's), so
    tests can be several clients' addresses."""

    def __init__(self, server: LiveServer, *, source: str | None = None) -> None:
        self.server = server
        self.source = source
        transport = httpx.HTTPTransport(local_address=source) if source else None
        self.client = httpx.Client(base_url=server.url, timeout=30, transport=transport)
        self.client.get("/").raise_for_status()

    @property
    def csrf_token(self) -> str:
        return self.client.cookies["csrftoken"]

    def post_stream(
        self, body: Any, *, url: str = "/api/chat/stream", **kwargs: Any
    ) -> httpx.Response:
        headers = {"X-CSRFToken": self.csrf_token, **kwargs.pop("headers", {})}
        return self.client.post(url, json=body, headers=headers, **kwargs)

    def stream(
        self, message: str, conversation: str | None = None, *, url: str = "/api/chat/stream"
    ) -> Generator[Event, None, None]:
        """Events of one answer, as they arrive; closing the generator closes the connection."""
        reader = SSEReader()
        headers = {"X-CSRFToken": self.csrf_token}
        body = {"message": message, "conversation": conversation}
        with self.client.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200, response.read()
            for chunk in response.iter_raw():
                yield from reader.feed(chunk)

    def ask(
        self, message: str, conversation: str | None = None, *, url: str = "/api/chat/stream"
    ) -> list[Event]:
        return list(self.stream(message, conversation, url=url))

    @property
    def session_key(self) -> str:
        return self.client.cookies["sessionid"]

    def cookies(self) -> dict[str, str]:
        return {cookie.name: cookie.value for cookie in self.client.cookies.jar}

    def raw(
        self,
        payload: Any,
        headers: dict[str, str] | None = None,
        *,
        path: str = "/api/chat/stream",
        method: str = "POST",
    ) -> "RawResponse":
        """POST ``payload`` as JSON on a raw socket, with this client's cookies and token."""
        return RawResponse(self.send(payload, headers, path=path, method=method))

    def send(
        self,
        payload: Any,
        headers: dict[str, str] | None = None,
        *,
        path: str = "/api/chat/stream",
        method: str = "POST",
    ) -> socket.socket:
        """``raw`` without reading the response: for requests that must be in flight at once."""
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        all_headers = {
            "Content-Type": "application/json",
            "X-CSRFToken": self.csrf_token,
            **(headers or {}),
        }
        return raw_post_send(
            self.server.port,
            body,
            cookies=self.cookies(),
            headers=all_headers,
            path=path,
            method=method,
            source=self.source,
        )

    def close(self) -> None:
        self.client.close()


def raw_request(port: int, request: bytes, *, source: str | None = None) -> socket.socket:
    """Send ``request`` on a new connection (from the loopback address ``source``)."""
    address = (source, 0) if source else None
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=address)
    sock.sendall(request)
    return sock


def settings_run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (which imports ``chatsite.settings``) in a fresh process from the
    checkout, with exactly ``env`` (plus PATH): settings read once, as a worker starts."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def from_db[T](query: Callable[[], T]) -> T:
    """Run ORM work on a thread of its own and return its result: while Playwright's sync API
    runs, the test's thread counts as async to Django, which refuses database calls there. The
    thread's connection is closed after, so none is left open at the database's flush."""

    def run() -> T:
        from django.db import connection

        try:
            return query()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def row_of(obj: Any) -> dict[str, Any]:
    """A model instance as the group writer's row (``assistant/services/table_rows.py``): every
    concrete field's value, by its attribute name."""
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


class RawResponse:
    """An HTTP/1.1 response read straight off a socket: exact headers, de-chunked body pieces."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        head = self._read_until(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers: list[tuple[str, str]] = []
        for line in header_lines:
            name, _, value = line.partition(":")
            self.headers.append((name.strip().lower(), value.strip()))

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name.lower()]
        return values[0] if values else None

    def header_count(self, name: str) -> int:
        return sum(1 for k, _ in self.headers if k == name.lower())

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._fill():
                raise ConnectionError("connection closed early")
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def _read_exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise ConnectionError("connection closed early")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def chunks(self) -> Iterator[tuple[float, bytes]]:
        """Each chunk of a chunked body with the monotonic time it was complete."""
        assert self.header("transfer-encoding") == "chunked"
        while True:
            size = int(self._read_until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                self._read_until(b"\r\n")
                return
            data = self._read_exact(size)
            self._read_exact(2)
            yield time.monotonic(), data

    def events(self) -> Iterator[Event]:
        reader = SSEReader()
        for at, data in self.chunks():
            yield from reader.feed(data, at)

    def body(self) -> bytes:
        if self.header("transfer-encoding") == "chunked":
            return b"".join(data for _, data in self.chunks())
        length = self.header("content-length")
        if length is not None:
            return self._read_exact(int(length))
        while self._fill():
            pass
        return self.buffer


@dataclass
class Visit:
    """A first visit to the page on a new connection: its status, body and the cookies it set."""

    status: int
    body: bytes
    retry_after: str | None
    cookies: dict[str, str]


def page_visit(port: int, source: str | None = None) -> Visit:
    """``GET /`` as a new browser (from the loopback address ``source``): a new session and a
    CSRF token, or the page's refusal."""
    response = raw_post(port, b"", method="GET", path="/", source=source)
    try:
        jar: SimpleCookie = SimpleCookie()
        for name, value in response.headers:
            if name == "set-cookie":
                jar.load(value)
        cookies = {name: morsel.value for name, morsel in jar.items()}
        return Visit(response.status, response.body(), response.header("retry-after"), cookies)
    finally:
        response.sock.close()


def raw_post(port: int, body: bytes, **kwargs: Any) -> RawResponse:
    """Send one request on a new connection and read the response head (``raw_post_send``)."""
    return RawResponse(raw_post_send(port, body, **kwargs))


def raw_post_send(
    port: int,
    body: bytes,
    *,
    cookies: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    path: str = "/api/chat/stream",
    method: str = "POST",
    source: str | None = None,
    chunked_body: bytes | None = None,
) -> socket.socket:
    """Send one request on a new connection (from ``source``); its response is left unread.
    ``chunked_body`` is sent instead of ``body``, in 64 KiB chunks, without a Content-Length."""
    lines = [f"{method} {path} HTTP/1.1"]
    if chunked_body is None:
        lines.append(f"Content-Length: {len(body)}")
    else:
        lines.append("Transfer-Encoding: chunked")
        pieces = [chunked_body[at : at + 65536] for at in range(0, len(chunked_body), 65536)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
    if not any(k.lower() == "host" for k in headers or {}):
        lines.append(f"Host: 127.0.0.1:{port}")
    if cookies:
        lines.append("Cookie: " + "; ".join(f"{k}={v}" for k, v in cookies.items()))
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    return raw_request(port, request, source=source)


class CountingProxy:
    """A TCP relay on loopback that counts the connections clients open through it (servers
    report requests, not connections)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.accepted = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._relays: list[asyncio.Future[object]] = []

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [client_w, upstream_w]
        relay = asyncio.gather(self._pipe(client_r, upstream_w), self._pipe(upstream_r, client_w))
        self._relays.append(relay)
        await relay

    def drop(self) -> None:
        """Cut every connection open now, as a network drop would; new ones still connect."""
        writers, self._writers = self._writers, []
        for writer in writers:
            writer.transport.abort()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[int]:
        """Serve on a free port (yielded) until the block ends, then drop every connection."""
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        try:
            yield server.sockets[0].getsockname()[1]
        finally:
            server.close()
            for writer in self._writers:
                writer.close()
            await asyncio.gather(*self._relays)
            await server.wait_closed()


class ThreadedCountingProxy:
    """A ``CountingProxy`` on its own event loop thread, for synchronous tests."""

    def __init__(self, upstream_port: int) -> None:
        self.proxy = CountingProxy(upstream_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),))

    @property
    def accepted(self) -> int:
        return self.proxy.accepted

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.proxy.running() as port:
            self.port = port
            self._ready.set()
            await self._stop.wait()

    def drop(self) -> None:
        """Cut every connection open now (see ``CountingProxy.drop``)."""
        done = threading.Event()

        def cut() -> None:
            self.proxy.drop()
            done.set()

        self._loop.call_soon_threadsafe(cut)
        assert done.wait(5)

    def __enter__(self) -> "ThreadedCountingProxy":
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()


class ModelServer:
    """``python -m llama_cpp.server`` with the embedded SmolLM2 on a free loopback port: the
    OpenAI-compatible server the vLLM engine's tests talk to (vLLM itself needs a GPU)."""

    def __init__(self, log: Path, *, threads: int = 2, extra: tuple[str, ...] = ()) -> None:
        from assistant.engines.llamacpp import default_model_path

        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        command = [
            sys.executable,
            *("-m", "llama_cpp.server", "--model", str(default_model_path())),
            *("--model_alias", "smollm2", "--host", "127.0.0.1", "--port", str(self.port)),
            *("--n_ctx", "2048", "--n_threads", str(threads), "--verbose", "False", *extra),
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
            )
        self.model = self._wait_for_models()

    def _wait_for_models(self) -> str:
        """The id of the first model the server lists, once it answers /v1/models."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                response = httpx.get(f"{self.base_url}/models", timeout=2)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            if response.status_code == 200:
                return str(response.json()["data"][0]["id"])
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(
            f"the model server did not start:\n{self.log.read_text(errors='replace')}"
        )

    def kill(self) -> None:
        """SIGKILL: the process vanishes mid-answer, as after an OOM kill or a crash."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


def staff_cookies(username: str) -> tuple[Any, dict[str, str]]:
    """A new staff user and the session cookie of a login as them."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_user(username, is_staff=True)
    client = Client()
    client.force_login(user)
    return user, {"sessionid": client.cookies["sessionid"].value}


def thread_trips(monkeypatch: "pytest.MonkeyPatch", module: ModuleType) -> list[str]:
    """The names of the functions ``module`` sends to a database thread (its ``run_db``), in
    the order sent, from now on."""
    sent: list[str] = []
    real = module.run_db

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(getattr(func, "func", func).__name__)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(module, "run_db", counted)
    return sent
