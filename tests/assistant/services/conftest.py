"""Fixtures of the answer runner's tests (``answer_support.py``): both serving paths on a
scripted engine of their own, a session the page issued, and a harness for it."""

from collections.abc import AsyncIterator

import pytest
from django.contrib.sessions.backends.cached_db import SessionStore
from pytest_django.fixtures import Settings

from assistant.services.identity import session_issue
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
