"""A follow-up asked the moment its conversation's last answer ends, in this process, with the
real group writer holding that answer (its batches after the first held back until the test
lets them go): the follow-up's history is completed with what the writer holds and waits for no
batch (``conversations.history_held``); rows that cannot complete it are waited for
(``conversations.conversation_written``) as before."""

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings

from assistant.engines.scripted import default_tokens
from assistant.services import answer_open, persistence
from assistant.services.conversations import conversation_written, history_held
from assistant.services.persistence import Rows
from tests.assistant.services.answer_support import ALIAS, WAIT_S, Harness, Live, question

pytestmark = pytest.mark.django_db(transaction=True)


class Gate:
    """The writer's batches held back (on its thread) until ``open``; with ``first_free``,
    the batches that make a conversation are written at once."""

    def __init__(self, *, first_free: bool) -> None:
        self.first_free = first_free
        self.opened = threading.Event()

    def open(self) -> None:
        self.opened.set()

    def write(self, batch: list[Rows]) -> None:
        if not (self.first_free and any(rows.conversations for rows in batch)):
            assert self.opened.wait(WAIT_S), "the test never let the writer go on"
        persistence_write(batch)


persistence_write = persistence.rows_write


@pytest.fixture
def events(engine_settings: Settings, tmp_path: Path) -> Path:
    """What the scripted engine was given at each start (``EVENTS_FILE``), written at once
    however few answers run."""
    path = tmp_path / "engine-events.jsonl"
    engine = engine_settings.CHATSITE_ENGINES[ALIAS]
    engine_settings.CHATSITE_ENGINES = {
        ALIAS: {**engine, "OPTIONS": {**engine["OPTIONS"], "EVENTS_FILE": str(path)}}
    }
    engine_settings.CHATSITE_STREAM = {
        **engine_settings.CHATSITE_STREAM,
        "PERSIST_BATCH_MS": 0,
    }
    return path


class Writer:
    """The writer held back (``gate``) and the conversations a question waited for
    (``conversation_written``): a wait lets the writer go on first, so nothing waits on the
    test."""

    def __init__(self) -> None:
        self.waited: list[uuid.UUID] = []
        self.gate = Gate(first_free=True)

    async def written(self, conversation_id: uuid.UUID) -> None:
        self.waited.append(conversation_id)
        self.gate.open()
        await conversation_written(conversation_id)


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Writer]:
    held = Writer()
    monkeypatch.setattr(answer_open, "conversation_written", held.written)
    monkeypatch.setattr(persistence, "rows_write", lambda batch: held.gate.write(batch))
    yield held
    held.gate.open()


def given(events: Path, tag: str) -> list[list[str]]:
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "start" and event.get("tag") == tag:
            return event["given"]
    raise AssertionError(f"no start tagged {tag}")


async def asked_and_ended(harness: Harness, tag: str, **options: Any) -> uuid.UUID:
    """An answer run to its end; its conversation."""
    answer = await harness.start(question(tag, tokens=3), **options)
    live = Live()
    await harness.ended(harness.run(answer, live))
    return answer.exchange.conversation_id


async def test_a_follow_up_is_completed_with_the_answer_the_writer_holds(
    harness: Harness, events: Path, writer: Writer
) -> None:
    conversation = await asked_and_ended(harness, "held-first")
    held = history_held(conversation, None)
    assert held is not None and [m["role"] for m in held] == ["assistant"]  # not stored yet
    follow_up = await harness.start(question("held-second", tokens=3), conversation=conversation)
    assert writer.waited == []  # waited for no batch
    writer.gate.open()
    await harness.ended(harness.run(follow_up, Live()))
    roles = [role for role, _ in given(events, "held-second")]
    assert roles == ["system", "user", "assistant", "user"]
    assert given(events, "held-second")[2][1] == "".join(default_tokens(3))
    stored = await harness.stored(follow_up)
    assert stored.conversation.id == conversation


async def test_a_follow_up_waits_for_rows_that_make_its_conversation(
    harness: Harness, events: Path, writer: Writer
) -> None:
    writer.gate.first_free = False  # nothing stored until a question waits
    conversation = await asked_and_ended(harness, "made-first")
    assert history_held(conversation, None) is None
    follow_up = await harness.start(question("made-second", tokens=3), conversation=conversation)
    assert writer.waited == [conversation]
    await harness.ended(harness.run(follow_up, Live()))
    roles = [role for role, _ in given(events, "made-second")]
    assert roles == ["system", "user", "assistant", "user"]
    await asyncio.wait_for(harness.stored(follow_up), WAIT_S)
