"""Answers kept for a resume after their end (``answer_registry.KeptAnswer``), in-process, on
real answers started with ``answer_start`` on the scripted engine: what a resume gets is the
answer's own frames, the answer itself is let go at once, and each kept answer is forgotten
once ``RESUME_KEEP_S`` is up (the registry's clock held by the test)."""

import gc
import weakref
from collections import deque

import pytest
from pytest_django.fixtures import Settings

from assistant.services import answer_registry, background
from assistant.services.answer_registry import KeptAnswer, answer_find
from tests.assistant.services.answer_support import WAIT_S, Harness, Live, collect, question

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    """``time`` as the registry reads it, moved only by the test."""

    def __init__(self, at: float) -> None:
        self.at = at

    def monotonic(self) -> float:
        return self.at


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The registry's clock held at 1000 s, with nothing kept from earlier tests (kept by the
    real clock)."""
    held = Clock(1000.0)
    monkeypatch.setattr(answer_registry, "time", held)
    monkeypatch.setattr(answer_registry, "_kept", deque())
    monkeypatch.setattr(answer_registry, "_resumable", {})
    return held


async def ended_answer(harness: Harness, tag: str, tokens: int = 3) -> tuple[str, Live]:
    """An answer run to its end, with the harness's hold on it given up: its request id and
    what its live listener heard."""
    answer = await harness.start(question(tag, tokens=tokens))
    live = Live()
    await harness.ended(harness.run(answer, live))
    harness.answers.remove(answer)
    return answer.request_id, live


async def test_an_ended_answer_is_kept_as_its_frames_and_let_go(harness: Harness) -> None:
    answer = await harness.start(question("kept", tokens=4))
    live = Live()
    task = harness.run(answer, live)
    await harness.ended(task)
    harness.answers.remove(answer)
    harness.tasks.remove(task)
    request_id, gone = answer.request_id, weakref.ref(answer)
    del answer, task
    assert await background.drain(within_s=WAIT_S) == 0  # its writes hold it until done

    kept = answer_find(owner_key=harness.owner_key, request_id=request_id)
    assert isinstance(kept, KeptAnswer)
    assert await collect(kept.listen(0)) == live.frames
    assert await collect(kept.listen(4)) == [live.frames[0], live.frames[-1]]  # open+meta, done
    # Freed as its last reference went, with nothing for the garbage collector to find; what
    # is kept is one object for the collector (its frames' tuples hold only bytes and ids, and
    # collections stop tracking them).
    assert gone() is None
    gc.collect()  # stops tracking the frames' tuples,
    gc.collect()  # then the tuple that holds them
    assert not any(gc.is_tracked(held) for held in (kept.frames, *kept.frames))


async def test_each_kept_answer_is_forgotten_once_its_time_is_up(
    harness: Harness, clock: Clock, settings: Settings
) -> None:
    keep_s = settings.CHATSITE_STREAM["RESUME_KEEP_S"]
    first, _ = await ended_answer(harness, "first")
    clock.at += 30
    second, _ = await ended_answer(harness, "second")

    def found() -> list[bool]:
        return [
            answer_find(owner_key=harness.owner_key, request_id=request_id) is not None
            for request_id in (first, second)
        ]

    clock.at = 1000.0 + keep_s - 0.001
    assert found() == [True, True]
    clock.at = 1000.0 + keep_s
    assert found() == [False, True]
    clock.at = 1030.0 + keep_s
    assert found() == [False, False]
    assert not answer_registry._kept  # let go of, not only hidden


async def test_the_kept_answers_are_let_go_without_a_resume_asking(
    harness: Harness, clock: Clock, settings: Settings
) -> None:
    """An answer ending lets go of those whose time is up, asked for or not."""
    first, _ = await ended_answer(harness, "old")
    clock.at += settings.CHATSITE_STREAM["RESUME_KEEP_S"]
    new, _ = await ended_answer(harness, "new")
    assert [kept.request_id for kept in answer_registry._kept] == [new]
    assert (harness.owner_key, first) not in answer_registry._resumable
    assert set(answer_registry._resumable) == {(harness.owner_key, new)}


async def test_nothing_is_kept_with_no_keep_time_or_an_answer_too_long_to_buffer(
    harness: Harness, clock: Clock, settings: Settings
) -> None:
    """Kept for no time: not found, even behind an answer kept for longer (the keep time
    changed between them); an answer whose frames overflowed its buffer: not kept."""
    longer, _ = await ended_answer(harness, "kept-longer")
    settings.CHATSITE_STREAM = {**settings.CHATSITE_STREAM, "RESUME_KEEP_S": 0.0}
    unkept, _ = await ended_answer(harness, "no-keep")
    settings.CHATSITE_STREAM = {
        **settings.CHATSITE_STREAM,
        "RESUME_KEEP_S": 60.0,
        "RESUME_MAX_BYTES": 200,
    }
    too_long, _ = await ended_answer(harness, "too-long", tokens=20)
    assert answer_find(owner_key=harness.owner_key, request_id=longer) is not None
    for request_id in (unkept, too_long):
        assert answer_find(owner_key=harness.owner_key, request_id=request_id) is None
