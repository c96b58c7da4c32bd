from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ChatClient, LiveServer, start_daphne

OUTPUT = Path(__file__).resolve().parent.parent / "test-output"


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


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT.mkdir(exist_ok=True)
    return OUTPUT


@pytest.fixture(scope="session")
def daphne_factory(django_db_setup: None, django_db_blocker, tmp_path_factory) -> Iterator:
    from django.db import connection

    servers: list[LiveServer] = []
    workdir = tmp_path_factory.mktemp("daphne")

    def start(**env: str) -> LiveServer:
        server = start_daphne(workdir=workdir, db_path=connection.settings_dict["NAME"], env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def daphne(daphne_factory) -> LiveServer:
    """Daphne with the scripted engine (50 ms to the first token, 20 ms between tokens)."""
    return daphne_factory(CHATSITE_PING_INTERVAL="15")


@pytest.fixture
def chat_client(daphne: LiveServer, transactional_db: None) -> Iterator[ChatClient]:
    client = ChatClient(daphne)
    yield client
    client.close()
