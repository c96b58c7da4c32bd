"""Fixtures of the answer runner's tests (``answer_support.py``): both serving paths on a
scripted engine of their own, a session the page issued, and a harness for it; and of the
tests of what goes by the event loop's own Redis client and what by a database thread."""

from collections.abc import AsyncIterator

import pytest
from django.contrib.sessions.backends.cached_db import SessionStore
from pytest_django.fixtures import Settings

from assistant import loop_postgres, loop_redis
from assistant.services.identity import session_issue
from assistant.services.stream_slots import RedisSlots, slot_store
from tests.assistant.services.answer_support import ALIAS, CLIENT, Harness


@pytest.fixture
def engine_settings(settings: Settings) -> Settings:
    """Both serving paths on a scripted engine of their own (rebuilt: its alias is new), a
    resume grace and keep long enough never to run out here, and no pings."""
    settings.CHATSITE_ENGINES = {
        ALIAS: {
            "BACKEND": "assistant.engines.scripted.ScriptedEngine",
            "OPTIONS": {"TTFT_MS": 0, "ITL_MS": 10, "TOKENS": 5, "MAX_STREAMS": 0},
        }
    }
    settings.CHATSITE_SERVING = {
        **settings.CHATSITE_SERVING,
        "ENGINES": {"direct": ALIAS, "django": ALIAS},
    }
    settings.CHATSITE_STREAM = {
        **settings.CHATSITE_STREAM,
        "PING_INTERVAL": 60.0,
        "RESUME_GRACE_S": 30.0,
        "RESUME_KEEP_S": 60.0,
    }
    return settings


@pytest.fixture
def session_key(transactional_db: None) -> str:
    """A session the page issued (``identity.session_issue``), stored in the database."""
    session = SessionStore()
    assert session_issue(session, client=CLIENT)
    assert session.session_key is not None
    return session.session_key


@pytest.fixture
async def harness(engine_settings: Settings, session_key: str) -> AsyncIterator[Harness]:
    harness = Harness(session_key)
    yield harness
    await harness.close()


@pytest.fixture
async def server_loop(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """This process as a server's entry point leaves it: its loop may have clients (Redis's,
    and on PostgreSQL a connection, closed after the test)."""
    monkeypatch.setattr(loop_redis, "_state", loop_redis._LoopClients())
    monkeypatch.setattr(loop_postgres, "_state", loop_postgres._LoopDatabase())
    loop_redis.loop_redis_allow()
    yield
    await loop_postgres.loop_postgres_close()
    await loop_redis.loop_redis_close()


@pytest.fixture
def redis_slots(
    redis_prefix: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> RedisSlots:
    """The production profile's cache and slots in Redis, one stream at a time per session (the
    site's default)."""
    from tests.assistant.services.test_admission import redis_site

    redis_site(settings, redis_prefix, monkeypatch)
    monkeypatch.setitem(settings.CHATSITE_STREAM, "STREAMS_PER_SESSION", 1)
    store = slot_store()
    assert isinstance(store, RedisSlots)
    return store
