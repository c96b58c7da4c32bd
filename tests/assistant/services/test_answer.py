"""The answer runner's own surface, in-process: ``run(live=...)``, ``run_apart()`` with
``listen(0, asker=True)``, ``listen(last_id)`` for a resume, ``detach()``, ``stop()`` and
``give_up()``, on real answers started with ``answer_start`` on the scripted engine, for a real
session stored in the database.

What is asserted is what the student sees: the exact frames of each listener, the rows stored
once the answer's background writes are done (its message and its stream record), and whether
the registry still finds the answer. Time bounds are sanity bounds only.
"""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pytest_django.fixtures import Settings

from assistant import errors
from assistant.engines.scripted import default_tokens
from assistant.services.answer_registry import (
    KeptAnswer,
    answer_find,
    answer_running,
    answer_stop,
)
from tests.assistant.services.answer_support import (
    OPEN,
    Frame,
    Harness,
    Live,
    Outcome,
    Status,
    assert_done,
    assert_meta,
    assert_tokens,
    collect,
    question,
    read,
    text_of,
    tokens_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


# --- the tests ------------------------------------------------------------------------------


async def test_run_sends_every_frame_to_the_live_listener_in_order(harness: Harness) -> None:
    """The live listener gets ``: open``, ``meta``, tokens 1..n, then ``done``, in that order;
    the question and the complete answer are stored, and the record's outcome is ``ok``."""
    asked = question("run", tokens=5)
    answer = await harness.start(asked)
    assert answer_running(answer.request_id)
    live = Live()
    await harness.ended(harness.run(answer, live))

    frames = live.read
    assert len(frames) == 8
    assert frames[0] == OPEN
    assert_meta(frames[1], answer, path="direct")
    assert_tokens(frames[2:7], default_tokens(5))
    assert_done(frames[7], tokens=5)
    assert not answer_running(answer.request_id)

    stored = await harness.stored(answer)
    meta = frames[1].data
    assert str(stored.answer.id) == meta["message"]
    assert str(stored.question.id) == meta["user_message"]
    assert str(stored.conversation.id) == meta["conversation"]
    assert stored.conversation.owner_key == harness.owner_key
    assert stored.question.content == asked
    assert stored.answer.content == "".join(default_tokens(5)) == text_of(frames)
    assert (stored.answer.status, stored.answer.finish_reason) == (Status.COMPLETE, "stop")
    record = stored.record
    assert (record.outcome, record.error_code) == (Outcome.OK, "")
    assert (record.path, record.engine, record.tokens) == ("direct", "scripted", 5)
    assert str(record.message_id) == meta["message"]
    assert record.owner_key == harness.owner_key


async def test_the_last_frame_ends_the_response_once_the_answer_is_closed(
    harness: Harness,
) -> None:
    """With ``end``, the last frame (``done``) goes to it instead of ``live``, once the answer is
    closed: its metrics counted and its engine's seat given back. A client that has ``done``
    can count on both."""
    answer = await harness.start(question("end", tokens=3))
    labels = {"path": "direct", "engine": answer.engine.name, "outcome": "ok", "server": ""}
    before = REGISTRY.get_sample_value("ai_streams_total", labels) or 0
    live, ended = Live(), Live()
    at_end: list[tuple[float | None, bool, bool]] = []

    async def end(frame: bytes) -> None:
        counted = REGISTRY.get_sample_value("ai_streams_total", labels)
        at_end.append((counted, answer.seat.seating is None, answer.finished))
        await ended(frame)

    task = asyncio.create_task(answer.run(live=live, end=end))
    harness.tasks.append(task)
    await harness.ended(task)

    assert [frame.kind for frame in live.read] == [":", "meta", "token", "token", "token"]
    (done,) = ended.read
    assert_done(done, tokens=3)
    # Counted and its seat given back; the buffer's listeners not told yet.
    assert at_end == [(before + 1, True, False)]
    assert answer.finished
    found = answer_find(owner_key=harness.owner_key, request_id=answer.request_id)
    assert isinstance(found, KeptAnswer) and found.request_id == answer.request_id
    assert (await collect(found.listen(0)))[-1] == ended.frames[0]  # kept for a resume too


async def test_listen_after_the_end_replays_only_the_tokens_after_last_id(
    harness: Harness,
) -> None:
    """A resume after the answer ended (within its keep time) gets ``: open``, the same
    ``meta``, exactly the tokens after ``last_id`` and the same ``done``; from 0 it gets all."""
    answer = await harness.start(question("replay", tokens=6))
    live = Live()
    await harness.ended(harness.run(answer, live))
    assert live.read[-1].kind == "done"

    found = answer_find(owner_key=harness.owner_key, request_id=answer.request_id)
    assert isinstance(found, KeptAnswer) and found.request_id == answer.request_id
    assert answer_find(owner_key="session:somebody-else", request_id=answer.request_id) is None

    resumed = await collect(found.listen(2))
    assert resumed == [live.frames[0], *live.frames[3:]]  # : open with meta, then token 3 on
    frames = read(resumed)
    assert frames[0] == OPEN
    assert_meta(frames[1], answer, path="direct")
    assert_tokens(frames[2:6], default_tokens(6)[2:], first_id=3)
    assert_done(frames[6], tokens=6)
    assert len(frames) == 7

    assert await collect(found.listen(0)) == live.frames
    assert read(await collect(found.listen(6))) == [frames[0], frames[1], frames[6]]


async def test_detach_with_a_grace_goes_on_for_a_resume(harness: Harness) -> None:
    """After ``detach()`` nothing more goes to the live listener, the answer goes on, and a
    ``listen(k)`` started after the detach gets the tokens after k and ``done``; the whole
    answer is stored, outcome ``ok``."""
    total = 20
    answer = await harness.start(question("detach-grace", tokens=total, itl_ms=40))
    live = Live()
    task = harness.run(answer, live)
    await live.until_tokens(2)
    answer.detach()
    heard = list(live.frames)
    last_id = int(tokens_of(read(heard))[-1].id or 0)
    assert last_id < total

    await asyncio.sleep(0.15)  # generating into the buffer, nobody listening
    found = answer_find(owner_key=harness.owner_key, request_id=answer.request_id)
    assert found is answer
    resumed = read(await collect(found.listen(last_id)))
    await harness.ended(task)

    assert live.frames == heard, "frames went to the live listener after detach()"
    assert resumed[0] == OPEN
    assert_meta(resumed[1], answer, path="direct")
    assert_tokens(resumed[2:-1], default_tokens(total)[last_id:], first_id=last_id + 1)
    assert_done(resumed[-1], tokens=total)

    stored = await harness.stored(answer)
    assert stored.answer.content == "".join(default_tokens(total))
    assert stored.answer.status == Status.COMPLETE
    assert (stored.record.outcome, stored.record.error_code) == (Outcome.OK, "")
    assert stored.record.tokens == total


async def test_detach_without_a_grace_ends_the_answer_and_stores_it_partial(
    harness: Harness, engine_settings: Settings
) -> None:
    """With no resume grace, ``detach()`` ends the answer soon: nothing more goes to the live
    listener, it cannot be resumed, and what was said is stored, status ``partial``, outcome
    ``client_abort``."""
    engine_settings.CHATSITE_STREAM = {**engine_settings.CHATSITE_STREAM, "RESUME_GRACE_S": 0.0}
    total = 200
    answer = await harness.start(question("detach-now", tokens=total, itl_ms=50))
    live = Live()
    task = harness.run(answer, live)
    await live.until_tokens(2)
    answer.detach()
    heard = list(live.frames)
    await harness.ended(task)

    assert live.frames == heard
    assert answer_find(owner_key=harness.owner_key, request_id=answer.request_id) is None
    assert not answer_running(answer.request_id)
    stored = await harness.stored(answer)
    said = text_of(read(heard))
    assert stored.answer.content.startswith(said)
    assert stored.answer.content != "".join(default_tokens(total))
    assert (stored.answer.status, stored.answer.finish_reason) == (Status.PARTIAL, "client_abort")
    assert (stored.record.outcome, stored.record.error_code) == (Outcome.CLIENT_ABORT, "")


async def test_stop_between_tokens_ends_at_once_without_an_error_event(
    harness: Harness,
) -> None:
    """Stop ends the answer at once, while the engine is between tokens: the stream ends with
    no ``error`` (and no ``done``) and no token after the Stop, the partial answer is stored,
    outcome ``client_abort``, and the answer no longer runs."""
    answer = await harness.start(question("stop", tokens=20, itl_ms=1500))
    live = Live()
    task = harness.run(answer, live)
    await live.until_tokens(2)
    assert answer_running(answer.request_id)
    answer.stop()
    await harness.ended(task)

    frames = live.read
    assert frames[0] == OPEN
    assert_meta(frames[1], answer, path="direct")
    assert_tokens(frames[2:], default_tokens(2))
    assert not answer_running(answer.request_id)
    # Stop ends the grace too: there is nothing left to resume.
    assert answer_find(owner_key=harness.owner_key, request_id=answer.request_id) is None

    stored = await harness.stored(answer)
    assert stored.answer.content == "".join(default_tokens(2))
    assert stored.answer.status == Status.PARTIAL
    assert (stored.record.outcome, stored.record.error_code) == (Outcome.CLIENT_ABORT, "")
    assert stored.record.tokens == 2


async def test_stop_through_the_registry_is_for_the_owner_only(harness: Harness) -> None:
    """``answer_stop`` (the Stop button) ends the owner's answer like ``stop()``; another
    session's Stop for the same id changes nothing."""
    answer = await harness.start(question("stop-registry", tokens=20, itl_ms=1500))
    live = Live()
    task = harness.run(answer, live)
    await live.until_tokens(1)
    assert not answer_stop(owner_key="session:somebody-else", request_id=answer.request_id)
    assert answer_stop(owner_key=harness.owner_key, request_id=answer.request_id)
    await harness.ended(task)

    frames = live.read
    assert [frame.kind for frame in frames] == [":", "meta", "token"]
    assert not answer_stop(owner_key=harness.owner_key, request_id=answer.request_id)
    stored = await harness.stored(answer)
    assert stored.answer.content == default_tokens(1)[0]
    assert stored.record.outcome == Outcome.CLIENT_ABORT


async def test_give_up_ends_with_an_error_event_saying_why(harness: Harness) -> None:
    """A seat given up for fair share ends the answer with an ``error`` event whose code is
    ``fair_share``; what was said is stored, outcome ``given_up``, error code ``fair_share``."""
    answer = await harness.start(question("give-up", tokens=20, itl_ms=1500))
    live = Live()
    task = harness.run(answer, live)
    await live.until_tokens(2)
    answer.give_up("fair_share")
    await harness.ended(task)

    frames = live.read
    assert frames[0] == OPEN
    assert_meta(frames[1], answer, path="direct")
    assert_tokens(frames[2:4], default_tokens(2))
    assert frames[4:] == [
        Frame(
            "error", {"code": "fair_share", "message": str(errors.GIVEN_UP["fair_share"].message)}
        )
    ]
    # The error event is kept for a resume too.
    found = answer_find(owner_key=harness.owner_key, request_id=answer.request_id)
    assert isinstance(found, KeptAnswer)
    assert await collect(found.listen(2)) == [live.frames[0], live.frames[-1]]

    stored = await harness.stored(answer)
    assert stored.answer.content == "".join(default_tokens(2))
    assert (stored.answer.status, stored.answer.finish_reason) == (Status.PARTIAL, "fair_share")
    assert (stored.record.outcome, stored.record.error_code) == (Outcome.GIVEN_UP, "fair_share")


@pytest.mark.parametrize(
    ("fail_after", "code", "error", "status"),
    [
        (2, "engine_error", errors.ENGINE_FAILED, Status.PARTIAL),
        (0, "engine_unavailable", errors.ENGINE_UNAVAILABLE, Status.FAILED),
    ],
    ids=["mid-answer", "before-the-first-token"],
)
async def test_an_engine_failure_ends_with_its_code(
    harness: Harness, fail_after: int, code: str, error: errors.ApiError, status: str
) -> None:
    """An engine that fails ends the stream with an ``error`` event carrying the engine's
    code (after the tokens it sent, if any); outcome ``engine_error``, the code stored in the
    record's ``error_code``, and what was said (if anything) stored."""
    asked = question(f"fail-{fail_after}", tokens=6, extra=f" fail_after={fail_after}")
    answer = await harness.start(asked)
    live = Live()
    await harness.ended(harness.run(answer, live))

    frames = live.read
    assert frames[0] == OPEN
    assert_meta(frames[1], answer, path="direct")
    assert_tokens(frames[2:-1], default_tokens(fail_after))
    assert frames[-1] == Frame("error", {"code": code, "message": error.message})

    stored = await harness.stored(answer)
    assert stored.question.content == asked
    assert stored.answer.content == "".join(default_tokens(fail_after))
    assert (stored.answer.status, stored.answer.finish_reason) == (status, code)
    assert (stored.record.outcome, stored.record.error_code) == (Outcome.ENGINE_ERROR, code)
    assert stored.record.tokens == fail_after


def _same_answer(frames: list[Frame]) -> Iterator[tuple[str, str | None, Any]]:
    """``frames`` without what differs between two answers to one question: their ids, their
    path, their timings."""
    for frame in frames:
        data = frame.data
        if frame.kind == "meta":
            data = sorted(data)
        elif frame.kind == "done":
            data = (data["finish_reason"], data["tokens"], sorted(data["timings"]))
        yield frame.kind, frame.id, data


async def test_run_apart_and_listen_as_the_asker_send_the_same_frames_as_run(
    harness: Harness,
) -> None:
    """The ``django`` path's way (``run_apart()``, then ``listen(0, asker=True)``) gives the
    same frames as ``run(live=...)`` for the same question, and stores the same answer."""
    asked = question("paths", tokens=7)
    direct = await harness.start(asked, path="direct")
    live = Live()
    await harness.ended(harness.run(direct, live))
    direct_stored = await harness.stored(direct)

    apart = await harness.start(asked, path="django")
    apart.run_apart()
    heard = read(await collect(apart.listen(0, asker=True)))

    assert heard[0] == OPEN
    assert_meta(heard[1], apart, path="django")
    assert_tokens(heard[2:9], default_tokens(7))
    assert_done(heard[9], tokens=7)
    assert len(heard) == 10
    assert list(_same_answer(heard)) == list(_same_answer(live.read))

    stored = await harness.stored(apart)
    assert str(stored.answer.id) == heard[1].data["message"]
    assert stored.answer.content == direct_stored.answer.content == text_of(heard)
    assert stored.answer.status == direct_stored.answer.status == Status.COMPLETE
    assert stored.record.outcome == direct_stored.record.outcome == Outcome.OK
    assert (stored.record.path, direct_stored.record.path) == ("django", "direct")
