"""The group writer's batches (``persistence.GroupWriter``): with few answers running, each row
is written the moment it is handed over; with ``PERSIST_BATCH_FROM`` or more running, a batch is
taken at most once every ``PERSIST_BATCH_MS``, so the rows handed over meanwhile share it. Every
row is stored either way, in the order given. Real database writes; the batches are read from
the writer's own calls to ``rows_write``."""

import asyncio
import gc
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from pytest_django.fixtures import Settings

from assistant.db import run_db
from assistant.engines import ChatMessage
from assistant.ids import ordered_uuid
from assistant.models import Conversation, StreamRecord
from assistant.services import conversations, persistence
from assistant.services.answer_registry import answer_ended, answer_register
from assistant.services.conversations import (
    Exchange,
    answer_rows,
    conversation_history,
    history_held,
    question_rows,
)
from assistant.services.persistence import (
    Rows,
    rows_hand_over,
    rows_store,
    rows_submit,
    rows_writing,
    rows_written,
)
from assistant.services.table_rows import Row
from tests.support import row_of

pytestmark = pytest.mark.django_db(transaction=True)

#: Long enough that rows handed over one after another fall in one interval on any machine.
EVERY_MS = 2000


@dataclass
class Running:
    """An answer as the registry counts it (the writer reads only how many run)."""

    request_id: str
    owner_key: str = "owner"


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each batch the writer stores, as its conversations' titles, in the order stored."""
    stored: list[list[str]] = []
    write = persistence.rows_write

    def counted(batch: list[Rows]) -> None:
        stored.append([c["title"] for rows in batch for c in rows.conversations])
        write(batch)

    monkeypatch.setattr(persistence, "rows_write", counted)
    return stored


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each wait the writer decided on before taking a batch, in seconds."""
    decided: list[float] = []
    pause = persistence._pause

    def counted(taken_at: float, now: float) -> float:
        decided.append(pause(taken_at, now))
        return decided[-1]

    monkeypatch.setattr(persistence, "_pause", counted)
    return decided


@pytest.fixture
def batching(settings: Settings) -> None:
    settings.CHATSITE_STREAM = {
        **settings.CHATSITE_STREAM,
        "PERSIST_BATCH_MS": EVERY_MS,
        "PERSIST_BATCH_FROM": 3,
    }


def running(count: int) -> Iterator[None]:
    answers = [Running(request_id=uuid.uuid4().hex) for _ in range(count)]
    for answer in answers:
        answer_register(answer, resumable=False)  # type: ignore[arg-type]
    yield
    for answer in answers:
        answer_ended(answer)  # type: ignore[arg-type]


@pytest.fixture
def busy() -> Iterator[None]:
    """As many answers running as batching starts at."""
    yield from running(3)


@pytest.fixture
def quiet() -> Iterator[None]:
    """One answer fewer."""
    yield from running(2)


def conversation(title: str) -> Rows:
    return Rows(conversations=[row_of(Conversation(owner_key="owner", title=title))])


async def hand_over_apart(titles: list[str]) -> None:
    """Each title's rows handed over a loop turn after the previous (not in one step), all
    awaited together."""
    stores = []
    for title in titles:
        stores.append(asyncio.ensure_future(rows_store(conversation(title))))
        await asyncio.sleep(0.001)
    await asyncio.gather(*stores)


async def stored_titles() -> list[str]:
    titles = Conversation.objects.order_by("title").values_list("title", flat=True)
    return await run_db(lambda: list(titles))


@pytest.mark.usefixtures("batching", "quiet")
async def test_with_few_answers_running_each_row_is_written_at_once(
    batches: list[list[str]], pauses: list[float]
) -> None:
    for title in ["a", "b", "c"]:
        await rows_store(conversation(title))
    assert pauses == [0, 0, 0]
    assert batches == [["a"], ["b"], ["c"]]
    assert await stored_titles() == ["a", "b", "c"]


@pytest.mark.usefixtures("batching", "busy")
async def test_with_many_answers_running_rows_wait_to_share_a_batch(
    batches: list[list[str]], pauses: list[float]
) -> None:
    """The first row after a pause is written at once; those handed over within the interval
    after it wait for the next batch, together, in the order given."""
    await rows_store(conversation("first"))
    await hand_over_apart(["b", "c", "d"])
    assert pauses[0] == 0
    assert 0 < pauses[1] <= EVERY_MS / 1000
    assert batches == [["first"], ["b", "c", "d"]]
    assert await stored_titles() == ["b", "c", "d", "first"]


@pytest.mark.usefixtures("busy")
async def test_no_interval_writes_at_once_however_many_answers_run(
    batches: list[list[str]], pauses: list[float], settings: Settings
) -> None:
    settings.CHATSITE_STREAM = {
        **settings.CHATSITE_STREAM,
        "PERSIST_BATCH_MS": 0,
        "PERSIST_BATCH_FROM": 3,
    }
    for title in ["a", "b"]:
        await rows_store(conversation(title))
    assert pauses == [0, 0]
    assert batches == [["a"], ["b"]]


@pytest.mark.usefixtures("batching", "quiet")
async def test_rows_submitted_together_share_a_batch_and_a_cancelled_future_still_stores(
    batches: list[list[str]],
) -> None:
    """``rows_submit`` hands rows over at once, in order, without a task of their own; what
    cancelling the caller cancels is its wait, not the writing."""
    first, second = rows_submit(conversation("a")), rows_submit(conversation("b"))
    second.cancel()
    await first
    assert batches == [["a", "b"]]
    assert await stored_titles() == ["a", "b"]


def test_the_wait_is_what_is_left_of_the_interval(batching: None, busy: None) -> None:
    assert persistence._pause(10.0, 10.1) == pytest.approx(EVERY_MS / 1000 - 0.1)
    assert persistence._pause(10.0, 10.0 + EVERY_MS / 1000) == 0.0
    assert persistence._pause(-float("inf"), 10.0) == 0.0


def conversation_id(rows: Rows) -> uuid.UUID:
    return rows.conversations[0]["id"]


@pytest.mark.usefixtures("batching", "busy")
async def test_a_conversation_is_waited_for_until_its_rows_are_stored() -> None:
    """Rows handed over while the writer waits out its interval: their conversation is known
    as being written, and ``rows_written`` returns once they are stored, not before."""
    await rows_store(conversation("first"))  # written at once; the next batch waits
    later = conversation("later")
    stored = rows_submit(later)
    assert rows_writing(conversation_id(later))
    assert not rows_writing(uuid.uuid4())
    await rows_written(conversation_id(later))
    assert stored.done()
    assert await stored_titles() == ["first", "later"]
    assert not rows_writing(conversation_id(later))


@pytest.mark.usefixtures("batching", "busy")
async def test_cancelling_the_rows_future_or_the_wait_leaves_the_conversation_waited_for() -> None:
    await rows_store(conversation("first"))
    later = conversation("later")
    rows_submit(later).cancel()
    waiter = asyncio.ensure_future(rows_written(conversation_id(later)))
    await asyncio.sleep(0.01)
    waiter.cancel()
    assert rows_writing(conversation_id(later))
    await rows_written(conversation_id(later))
    assert await stored_titles() == ["first", "later"]


@pytest.mark.usefixtures("batching", "busy")
async def test_a_follow_up_waits_no_longer_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the rows still waiting for the writer's interval (2 s), a follow-up's wait ends
    after ``WRITTEN_WAIT_S`` (here 50 ms): it goes on with what is stored."""
    monkeypatch.setattr(conversations, "WRITTEN_WAIT_S", 0.05)
    await rows_store(conversation("first"))
    later = conversation("later")
    stored = rows_submit(later)
    await conversations.conversation_written(conversation_id(later))
    assert rows_writing(conversation_id(later)) and not stored.done()
    await stored


@pytest.mark.usefixtures("batching", "quiet")
async def test_rows_handed_over_are_stored_without_a_task_and_a_refusal_is_the_writers_to_tell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``rows_hand_over`` (a question's rows): stored in order with no task of their own, and
    a row the database refuses is the writer's one warning line, with nothing left for asyncio
    to report as never retrieved."""
    reported: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    first = conversation("first")
    await rows_store(first)
    tasks = asyncio.all_tasks()  # the writer's own among them
    second = conversation("second")
    rows_hand_over(second)
    rows_hand_over(Rows(conversations=[dict(first.conversations[0])]))  # its id again: refused
    assert asyncio.all_tasks() == tasks
    await rows_written(conversation_id(first))
    await rows_written(conversation_id(second))
    await rows_store(conversation("third"))  # the writer holds this batch now, not theirs
    assert await stored_titles() == ["first", "second", "third"]
    gc.collect()
    assert reported == []
    refused = [r for r in caplog.records if r.getMessage().startswith("Could not store")]
    assert len(refused) == 1


def exchange(conversation_id: uuid.UUID, replaces: uuid.UUID | None = None) -> Exchange:
    return Exchange(
        conversation_id=conversation_id,
        user_message_id=ordered_uuid(),
        answer_message_id=ordered_uuid(),
        is_new_conversation=False,
        request_id=uuid.uuid4().hex,
        replaces=replaces,
    )


def said(conversation_id: uuid.UUID, question: str, answer: str) -> list[Rows]:
    """An exchange's rows as an answer stores them: its question's, then its answer's."""
    asked = exchange(conversation_id)
    outcome = StreamRecord.Outcome.OK if answer else StreamRecord.Outcome.ENGINE_ERROR
    return [
        question_rows(owner_key="owner", classroom_id=None, exchange=asked, question=question),
        answer_rows(exchange=asked, content=answer, outcome=outcome, finish_reason="stop"),
    ]


@pytest.mark.usefixtures("batching", "busy")
async def test_a_follow_ups_history_is_completed_with_the_messages_the_writer_holds() -> None:
    """Two exchanges held through the writer's interval (the second's answer failed before any
    text): a follow-up's history has them at its end, in order, before they are stored and
    after, each once; nothing is held once they are stored."""
    made = conversation("made")
    await rows_store(made)  # stored at once; the next batch waits for the interval
    held_for = conversation_id(made)
    stores = [
        rows_submit(rows)
        for rows in [*said(held_for, "why?", "because"), *said(held_for, "and?", "")]
    ]
    held = history_held(held_for, None)
    assert held is not None and [m["content"] for m in held] == ["why?", "because", "and?", ""]
    assert history_held(uuid.uuid4(), None) == []
    expected = [
        ChatMessage(role="user", content="why?"),
        ChatMessage(role="assistant", content="because"),
        ChatMessage(role="user", content="and?"),
    ]

    def history(limit: int, held: Sequence[Row]) -> list[ChatMessage]:
        return conversation_history(
            owner_key="owner", classroom_id=None, conversation_id=held_for, limit=limit, held=held
        )

    assert await run_db(history, 50, []) == []  # nothing stored yet
    assert await run_db(history, 50, held) == expected
    assert await run_db(history, 2, held) == expected[1:]
    await asyncio.gather(*stores)
    assert history_held(held_for, None) == []
    assert await run_db(history, 50, []) == expected
    assert await run_db(history, 50, held) == expected  # stored meanwhile: once
    assert await run_db(history, 2, held) == expected[1:]


@pytest.mark.usefixtures("batching", "busy")
async def test_rows_that_make_a_conversation_or_set_a_question_aside_are_waited_for() -> None:
    """A conversation whose rows held make it, or set a question aside, cannot be completed:
    ``history_held`` is None, and the follow-up waits for them (``conversation_written``);
    nor can a question replacing another, whatever is held."""
    await rows_store(conversation("first"))
    made = conversation("made")
    stores = [rows_submit(made)]
    assert history_held(conversation_id(made), None) is None
    stored = conversation("stored")
    await asyncio.gather(*stores, rows_store(stored))
    assert history_held(conversation_id(made), None) == []
    assert history_held(conversation_id(made), uuid.uuid4()) is None
    question, answer = said(conversation_id(stored), "why?", "because")
    stores = [rows_submit(question), rows_submit(answer)]
    asked_again = question_rows(
        owner_key="owner",
        classroom_id=None,
        exchange=exchange(conversation_id(stored), replaces=question.messages[0]["id"]),
        question="why, again?",
    )
    assert history_held(conversation_id(stored), None) is not None
    stores.append(rows_submit(asked_again))
    assert history_held(conversation_id(stored), None) is None
    await asyncio.gather(*stores)
    assert history_held(conversation_id(stored), None) == []
