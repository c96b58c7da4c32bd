import os
import secrets
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support import (
    REDIS_URL,
    ChatClient,
    LiveServer,
    NginxServer,
    start_daphne,
    start_nginx,
)

OUTPUT = Path(__file__).resolve().parent.parent / "test-output"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The translations as the site reads them: a .po edited since scripts/setup compiled it
    is compiled again before any server under test starts."""
    from assistant.catalogues import compile_catalogues

    compile_catalogues()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep a SQLite test database in a file, so Daphne processes under test share it
    (a PostgreSQL test database is shared anyway)."""
    from django.db import connections

    settings = connections["default"].settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        settings["TEST"]["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")
    else:
        # No pool in this process: PostgreSQL would refuse to drop the test database at the end
        # while the pool holds connections to it.
        settings["OPTIONS"].pop("pool", None)


@pytest.fixture(scope="session", autouse=True)
def _flush_retries_a_deadlock() -> Iterator[None]:
    """PostgreSQL: the TRUNCATE that ends a transactional test can deadlock with a write a
    server under test is still finishing (an answer stored after its client left), and
    PostgreSQL then cancels one of the two. The flush is tried again instead of failing the
    test it follows; the server's write is retried by the app itself."""
    from django.core.management.commands import flush
    from django.db import OperationalError

    handle = flush.Command.handle

    def handle_retrying(self, *args, **options):  # type: ignore[no-untyped-def]
        for attempt in range(5):
            try:
                return handle(self, *args, **options)
            except Exception as exc:  # CommandError wrapping the database's error
                if not isinstance(exc.__cause__, OperationalError) or attempt == 4:
                    raise
                time.sleep(0.2)
        return None

    flush.Command.handle = handle_retrying  # type: ignore[method-assign]
    yield
    flush.Command.handle = handle  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def _one_address_for_every_test_client() -> None:
    """In-process requests all come from 127.0.0.1: lift the new-session limit per address
    (the tests of that limit set their own)."""
    from django.conf import settings

    settings.CHATSITE_CLIENTS["NEW_SESSIONS_PER_MINUTE"] = 0


@pytest.fixture(autouse=True)
def _site_language_after_each_test() -> Iterator[None]:
    """A test's in-process request in Chinese leaves Chinese active in this thread (Django's
    LocaleMiddleware activates, nothing deactivates): the next test would read a lazy message
    in Chinese. Each test ends with the site's default language again."""
    yield
    from django.utils import translation

    translation.deactivate()


@pytest.fixture
def rate_clock_held(monkeypatch: pytest.MonkeyPatch) -> float:
    """The rate limits' clock (``ratelimit.rate_window``'s, in this process) held at the time
    the test starts, so that requests counted up to a per-minute limit all fall in one window:
    a fixed window's count starts again when its minute turns, and a slow run's requests would
    straddle it. The held time."""
    from types import SimpleNamespace

    from assistant.services import ratelimit

    held = time.time()
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: held))
    return held


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected loopback TCP pair: (the server's end, the client's end)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    try:
        yield accepted, client
    finally:
        accepted.close()
        client.close()


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(exist_ok=True)
    return OUTPUT


def _daphne_starter(tmp_path_factory: pytest.TempPathFactory, *, uvicorn: bool = False) -> Iterator:
    """Start Daphne workers (``uvicorn``: the same application under uvicorn) on the tests'
    database; each is stopped when the fixture ends."""
    from django.db import connection

    servers: list[LiveServer] = []
    workdir = tmp_path_factory.mktemp("uvicorn" if uvicorn else "daphne")

    def start(**env: str) -> LiveServer:
        server = start_daphne(
            workdir=workdir, db_path=connection.settings_dict["NAME"], env=env, uvicorn=uvicorn
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def daphne_factory(django_db_setup: None, django_db_blocker, tmp_path_factory) -> Iterator:
    """Start workers for this module; they stop when it ends. On PostgreSQL each running
    worker keeps up to CHATSITE_DB_POOL_SIZE connections open and the server allows 100 in
    all, so a whole run's workers must not all live until its end."""
    yield from _daphne_starter(tmp_path_factory)


@pytest.fixture(scope="module")
def uvicorn_factory(django_db_setup: None, django_db_blocker, tmp_path_factory) -> Iterator:
    """``daphne_factory``'s workers under uvicorn instead (its production settings: uvloop,
    httptools where installed, the lifespan protocol, CHATSITE_DRAIN_S to finish at SIGTERM)."""
    yield from _daphne_starter(tmp_path_factory, uvicorn=True)


@pytest.fixture
def worker_factory(request: pytest.FixtureRequest) -> Any:
    """The factory of the server a test is parametrized with (``server_kind``: daphne or
    uvicorn)."""
    return request.getfixturevalue(f"{request.getfixturevalue('server_kind')}_factory")


@pytest.fixture(scope="session")
def daphne(django_db_setup: None, django_db_blocker, tmp_path_factory) -> Iterator[LiveServer]:
    """Daphne with the scripted engine (50 ms to the first token, 20 ms between tokens)."""
    starter = _daphne_starter(tmp_path_factory)
    start = next(starter)
    yield start(CHATSITE_PING_INTERVAL="15")
    next(starter, None)  # stops it


@pytest.fixture(scope="module")
def production(daphne_factory) -> LiveServer:
    """Daphne with production-style settings, behind TLS terminated by a proxy."""
    return daphne_factory(
        CHATSITE_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(38)[:50],
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        CHATSITE_TLS="1",
    )


@pytest.fixture
def chat_client(daphne: LiveServer, transactional_db: None) -> Iterator[ChatClient]:
    client = ChatClient(daphne)
    yield client
    client.close()


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    path = shutil.which("nginx", path=search)
    if path is None:
        pytest.fail("nginx is not installed: install Debian's nginx (scripts/setup --test does).")
    return path


@pytest.fixture(scope="module")
def nginx_factory(
    nginx_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., NginxServer]]:
    """Start nginx on a deploy/nginx site in front of the given worker ports (and ``edits``;
    ``uvicorn_workers``: chatsite-servers.conf's uvicorn pool)."""
    servers: list[NginxServer] = []

    def start(
        site: str,
        workers: Sequence[int],
        edits: Sequence[Any] = (),
        uvicorn_workers: Sequence[int] = (),
    ) -> NginxServer:
        work = tmp_path_factory.mktemp("nginx")
        server = start_nginx(nginx_binary, work, site, workers, edits, uvicorn_workers)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own in the machine's Redis; its keys are deleted after."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()
