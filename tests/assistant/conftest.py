"""Fixtures shared by the assistant's tests."""

import logging
from collections.abc import Iterator

import pytest
from pytest_django.fixtures import Settings

from assistant.services import stream_slots


@pytest.fixture
def local_memory(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local profile's stores, whichever profile the suite runs on: Django's cache (the
    sessions' and the rate counts') and the stream slots in this process's memory. Ask for it
    before any fixture that makes a session."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    monkeypatch.setattr(stream_slots, "_store", None)


@pytest.fixture
def streams_log() -> Iterator[list[logging.LogRecord]]:
    """The records the ``assistant.streams`` logger handles, as any handler gets them."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger, handler = logging.getLogger("assistant.streams"), Keep()
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
