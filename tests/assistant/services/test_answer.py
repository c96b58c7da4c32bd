"""The answer runner's own surface, in-process: ``run(live=...)``, ``run_apart()`` with
``listen(0, asker=True)``, ``listen(last_id)`` for a resume, ``detach()``, ``stop()`` and
``give_up()``, on real answers started with ``answer_start`` on the scripted engine, for a real
session stored in the database.

What is asserted is what the student sees: the exact frames of each listener, the rows stored
once the answer's background writes are done (its message and its stream record), and whether
the registry still finds the answer. Time bounds are sanity bounds only.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.sessions.backends.cached_db import SessionStore
from pytest_django.fixtures import Settings

from assistant import errors
from assistant.benchmarking.frames import SSEParser
from assistant.db import run_db
from assistant.engines.scripted import default_tokens
from assistant.models import Conversation, Message, StreamRecord
from assistant.services import background
from assistant.services.answer import Answer
from assistant.services.answer_registry import answer_find, answer_running, answer_stop
from assistant.services.answer_start import answer_start
from assistant.services.identity import session_issue, session_pseudonym
from assistant.services.timings import StreamTimings, now

pytestmark = pytest.mark.django_db(transaction=True)

#: The engine alias both serving paths use in these tests.
ALIAS = "answer-tests"
#: The client address every answer here comes from.
CLIENT = "203.0.113.20"
#: Sanity bound on any wait for an answer (seconds).
WAIT_S = 10.0

Outcome = StreamRecord.Outcome
Status = Message.Status


# --- frames ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame as a browser reads it: a comment (``kind`` ":", ``data`` its text) or an
    event (``kind`` its name, ``data`` its JSON, ``id`` its id field, if any)."""

    kind: str
    data: Any
    id: str | None = None


def read(frames: list[bytes]) -> list[Frame]:
    """Each raw frame as the one comment or event it must be, parsed on its own."""
    read_frames = []
    for raw in frames:
        if raw.startswith(b":"):
            assert raw.endswith(b"\n\n"), raw
            read_frames.append(Frame(":", raw.decode("utf-8").strip().removeprefix(":").strip()))
            continue
        events = SSEParser().feed(raw)
        assert len(events) == 1, raw
        event = events[0]
        read_frames.append(Frame(event.event, json.loads(event.data), event.id))
    return read_frames


def tokens_of(frames: list[Frame]) -> list[Frame]:
    return [frame for frame in frames if frame.kind == "token"]


def text_of(frames: list[Frame]) -> str:
    return "".join(frame.data["text"] for frame in tokens_of(frames))


def assert_tokens(frames: list[Frame], texts: list[str], *, first_id: int = 1) -> None:
    """``frames`` are exactly the tokens ``texts``, numbered from ``first_id``."""
    expected = [Frame("token", {"text": text}, str(first_id + i)) for i, text in enumerate(texts)]
    assert frames == expected


def assert_meta(frame: Frame, answer: Answer, *, path: str) -> None:
    """The ``meta`` event names this answer, its conversation and its two messages."""
    assert frame.kind == "meta" and frame.id is None
    assert frame.data == {
        "request_id": answer.request_id,
        "conversation": frame.data["conversation"],
        "message": frame.data["message"],
        "user_message": frame.data["user_message"],
        "path": path,
        "engine": "scripted",
    }
    ids = {frame.data[key] for key in ("conversation", "message", "user_message")}
    assert len({uuid.UUID(value) for value in ids}) == 3


def assert_done(frame: Frame, *, tokens: int, finish_reason: str = "stop") -> None:
    assert frame.kind == "done" and frame.id is None
    assert frame.data["finish_reason"] == finish_reason
    assert frame.data["tokens"] == tokens
    assert isinstance(frame.data["timings"], dict)


OPEN = Frame(":", "open")


class Live:
    """A live listener (``run(live=...)``): keeps every frame, and can wait for one."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self._changed = asyncio.Event()

    async def __call__(self, frame: bytes) -> None:
        self.frames.append(frame)
        self._changed.set()

    @property
    def read(self) -> list[Frame]:
        return read(self.frames)

    async def until(self, seen: Callable[[list[Frame]], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not seen(self.read):
                self._changed.clear()
                await self._changed.wait()

    async def until_tokens(self, count: int) -> None:
        await self.until(lambda frames: len(tokens_of(frames)) >= count)


async def collect(frames: AsyncIterator[bytes]) -> list[bytes]:
    """Every frame of a listener, to the end of the answer."""
    got = []
    async with asyncio.timeout(WAIT_S):
        async for frame in frames:
            got.append(frame)
    return got


# --- answers, sessions and rows -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stored:
    question: Message
    answer: Message
    record: StreamRecord
    conversation: Conversation


def _stored(request_id: str) -> Stored:
    messages = {m.role: m for m in Message.objects.filter(request_id=request_id)}
    answer = messages[Message.Role.ASSISTANT]
    return Stored(
        question=messages[Message.Role.USER],
        answer=answer,
        record=StreamRecord.objects.get(request_id=request_id),
        conversation=Conversation.objects.get(id=answer.conversation_id),
    )


@dataclass
class Harness:
    """Starts answers for one session, as a serving path would, and cleans up after them."""

    session_key: str
    answers: list[Answer] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def owner_key(self) -> str:
        return f"session:{session_pseudonym(self.session_key)}"

    async def start(self, question: str, *, path: str = "direct") -> Answer:
        answer = await answer_start(
            body=json.dumps({"message": question}).encode(),
            session_key=self.session_key,
            class_hint=None,
            client=CLIENT,
            request_id=uuid.uuid4().hex,
            serving_path=path,
            timings=StreamTimings(received=now()),
        )
        self.answers.append(answer)
        return answer

    def run(self, answer: Answer, live: Live) -> asyncio.Task[None]:
        """``answer.run(live=...)`` in a task of its own, as the ``direct`` path's consumer."""
        task = asyncio.create_task(answer.run(live=live))
        self.tasks.append(task)
        return task

    async def ended(self, task: asyncio.Task[None]) -> None:
        async with asyncio.timeout(WAIT_S):
            await task

    async def stored(self, answer: Answer) -> Stored:
        """The rows of an answer that has ended, once its background writes are done."""
        assert answer.finished
        assert await background.drain(within_s=WAIT_S) == 0
        return await run_db(_stored, answer.request_id)

    async def close(self) -> None:
        for answer in self.answers:
            answer.stop()
        pending = [task for task in self.tasks if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=WAIT_S)
        assert await background.drain(within_s=WAIT_S) == 0


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


def question(tag: str, *, tokens: int = 5, itl_ms: int = 10, extra: str = "") -> str:
    directive = f"[scripted tokens={tokens} ttft_ms=0 itl_ms={itl_ms} tag={tag}{extra}]"
    return f"{directive} How do plants make food?"


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
    assert found is answer
    assert answer_find(owner_key="session:somebody-else", request_id=answer.request_id) is None

    resumed = await collect(found.listen(2))
    assert resumed == [*live.frames[:2], *live.frames[4:]]
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
    assert found is answer
    assert await collect(found.listen(2)) == [*live.frames[:2], live.frames[-1]]

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
