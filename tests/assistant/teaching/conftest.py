"""What every teaching test starts from: a fresh cache and fast password hashes, and a small
school (``teaching_support.World``)."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.assistant.teaching.teaching_support import World, fresh_start, world_make


@pytest.fixture(autouse=True)
def _fresh(settings: Any) -> Iterator[None]:
    yield from fresh_start(settings)


@pytest.fixture
def world() -> World:
    return world_make()
