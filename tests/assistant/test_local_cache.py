"""The local profile's cache (``assistant.cache.in_process_cache``): one object for the process,
reading and counting what Django's cache objects do, and no cache object made for each task on
the event loop by what a question does there (its rate count, its session found in memory)."""

import asyncio
import contextvars
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client
from pytest_django.fixtures import Settings

from assistant.cache import in_process_cache
from assistant.services.identity import identity_in_memory, identity_resolve
from assistant.services.ratelimit import counter_hit


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The aliases Django's ``caches`` makes a cache object for, from now on."""
    aliases: list[str] = []
    create = caches.create_connection

    def counted(alias: str) -> Any:
        aliases.append(alias)
        return create(alias)

    monkeypatch.setattr(caches, "create_connection", counted)
    return aliases


def in_new_tasks(call: Callable[[], Any], count: int) -> list[Any]:
    """``call()`` in ``count`` tasks one after the other, each in a new, empty context (as a
    server starts each request's task), on a loop of its own."""

    async def run() -> Any:
        return call()

    async def each() -> list[Any]:
        return [
            await asyncio.create_task(run(), context=contextvars.Context()) for _ in range(count)
        ]

    return asyncio.run(each())


def test_one_object_for_the_process_sees_what_djangos_cache_objects_see(
    local_memory: None,
) -> None:
    cache = in_process_cache()
    assert cache is not None
    assert in_process_cache() is cache
    caches["default"].set("written-by-django", 7)
    assert cache.get("written-by-django") == 7
    cache.set("written-here", 8)
    assert caches["default"].get("written-here") == 8


def test_rate_counts_from_new_tasks_make_no_cache_object_and_count_together(
    local_memory: None, made: list[str]
) -> None:
    in_process_cache()  # made once, before the tasks
    made.clear()
    counts = in_new_tasks(lambda: counter_hit("ratelimit:chat:t:1", timeout=60), 5)
    assert counts == [1, 2, 3, 4, 5]
    assert made == []
    assert caches["default"].get("ratelimit:chat:t:1") == 5


@pytest.mark.django_db
def test_a_session_found_in_memory_from_new_tasks_makes_no_cache_object(
    local_memory: None, made: list[str]
) -> None:
    client = Client()
    client.get("/")
    key = client.session.session_key
    assert key is not None
    identity_in_memory(key)  # what it reads is worked out once, before the tasks
    made.clear()
    known = in_new_tasks(lambda: identity_in_memory(key), 3)
    assert known == [identity_resolve(key)] * 3
    assert made == []


def test_another_cache_is_not_this_process_memory(
    local_memory: None, settings: Settings, tmp_path: Path
) -> None:
    assert in_process_cache() is not None
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path),
        }
    }
    assert in_process_cache() is None
    # Counted in the file cache, as Django's cache object counts.
    assert [counter_hit("ratelimit:chat:f:1", timeout=60) for _ in range(2)] == [1, 2]
    assert caches["default"].get("ratelimit:chat:f:1") == 2
