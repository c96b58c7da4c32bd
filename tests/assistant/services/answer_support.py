"""What the answer runner's tests share: frames read as a browser reads them, a live listener,
and a harness that starts real answers for one session (``answer_start`` on the scripted engine)
and finds their stored rows. The fixtures are in this folder's ``conftest.py``."""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from assistant.benchmarking.frames import SSEParser
from assistant.db import run_db
from assistant.models import Conversation, Message, StreamRecord
from assistant.services import background
from assistant.services.answer import Answer
from assistant.services.answer_start import answer_start
from assistant.services.identity import session_pseudonym
from assistant.services.timings import StreamTimings, now

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
    """Each raw frame as the comments and events it holds, each whole and parsed on its own
    (``: open`` and ``meta`` are sent as one)."""
    read_frames = []
    for raw in frames:
        assert raw.endswith(b"\n\n"), raw
        for piece in raw.removesuffix(b"\n\n").split(b"\n\n"):
            if piece.startswith(b":"):
                read_frames.append(Frame(":", piece.decode("utf-8").removeprefix(":").strip()))
                continue
            events = SSEParser().feed(piece + b"\n\n")
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

    async def start(
        self, question: str, *, path: str = "direct", conversation: uuid.UUID | None = None
    ) -> Answer:
        asked: dict[str, str] = {"message": question}
        if conversation is not None:
            asked["conversation"] = str(conversation)
        answer = await answer_start(
            body=json.dumps(asked).encode(),
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


def question(tag: str, *, tokens: int = 5, itl_ms: int = 10, extra: str = "") -> str:
    directive = f"[scripted tokens={tokens} ttft_ms=0 itl_ms={itl_ms} tag={tag}{extra}]"
    return f"{directive} How do plants make food?"
