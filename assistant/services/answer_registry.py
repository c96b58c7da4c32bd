"""The answers this process runs, found by request id: for a resume, for Stop, and so that no two
answers run under one id.

Answers live in this process's memory: a resume or a stop must reach the worker that runs the
answer (one worker by default; behind nginx, see docs/deploy.md). Only the answer's owner (the
same session or user) may resume or stop it. Everything here runs on the event loop that runs
the answers.
"""

import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from assistant.services.answer_buffer import Frame, resumed


class LiveAnswer(Protocol):
    """What the registry needs of an answer (``services.answer.Answer``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def owner_key(self) -> str: ...
    @property
    def finished(self) -> bool: ...
    @property
    def abandoned(self) -> bool: ...
    @property
    def complete(self) -> bool: ...
    def stop(self) -> None: ...
    def preempt(self) -> None: ...
    def listen(self, last_id: int) -> AsyncIterator[bytes]: ...


@dataclass(frozen=True, slots=True, eq=False)
class KeptAnswer:
    """An answer that has ended, kept for a resume as its frames alone (``answer_keep``).

    What a running answer holds (its engine's stream, timings, seat, buffer, events, timers)
    is let go as it ends. A worker keeps every answer of the last ``RESUME_KEEP_S`` (a minute:
    thousands at a school's rate), and each of them held whole was some 25 objects more for
    every collection of Python's garbage collector to walk, where this is one (its frames are
    bytes, which the collector does not track)."""

    request_id: str
    owner_key: str
    frames: tuple[Frame, ...]
    #: When it is forgotten (``time.monotonic``).
    until: float

    finished: ClassVar[bool] = True
    abandoned: ClassVar[bool] = False
    complete: ClassVar[bool] = True

    def stop(self) -> None:
        """It has ended already."""

    def preempt(self) -> None:
        """It has ended already."""

    async def listen(self, last_id: int = 0) -> AsyncIterator[bytes]:
        for token_id, frame in self.frames:
            if resumed(token_id, last_id):
                yield frame


#: Answers that can be resumed, by (owner, request id): only while resuming is on, and for
#: ``RESUME_KEEP_S`` after they end (then as a ``KeptAnswer``).
_resumable: dict[tuple[str, str], LiveAnswer] = {}
#: Answers still running, by request id, whether resuming is on or not.
_running: dict[str, LiveAnswer] = {}
#: The answers kept after their end, oldest first: each is forgotten once its time is up.
_kept: deque[KeptAnswer] = deque()


def answer_register(answer: LiveAnswer, *, resumable: bool) -> None:
    _running[answer.request_id] = answer
    if resumable:
        _resumable[(answer.owner_key, answer.request_id)] = answer


def answer_ended(answer: LiveAnswer) -> None:
    """``answer`` no longer runs (it may still be resumed until ``answer_forget``)."""
    if _running.get(answer.request_id) is answer:
        del _running[answer.request_id]


def answer_forget(answer: LiveAnswer) -> None:
    """``answer`` can no longer be resumed."""
    key = (answer.owner_key, answer.request_id)
    if _resumable.get(key) is answer:  # a request id may be reused by a later answer
        del _resumable[key]


def answer_keep(answer: LiveAnswer, frames: Sequence[Frame], keep_s: float) -> None:
    """``answer`` has ended with ``frames``: resumable for ``keep_s`` more seconds, as a
    ``KeptAnswer`` in its place; not at all when it was forgotten meanwhile (stopped) or when
    its buffer could not hold every frame."""
    key = (answer.owner_key, answer.request_id)
    if _resumable.get(key) is not answer:
        return
    del _resumable[key]
    now = time.monotonic()
    _expire(now)
    if not answer.complete:
        return
    kept = KeptAnswer(answer.request_id, answer.owner_key, tuple(frames), now + keep_s)
    _resumable[key] = kept
    _kept.append(kept)


def _expire(now: float) -> None:
    """Forget the kept answers whose time is up."""
    while _kept and _kept[0].until <= now:
        kept = _kept.popleft()
        answer_forget(kept)


def answers_running() -> list[LiveAnswer]:
    """Every answer still running in this process."""
    return list(_running.values())


def answers_running_count() -> int:
    """How many answers are running in this process."""
    return len(_running)


def answer_running(request_id: str) -> bool:
    """Whether an answer runs under ``request_id`` in this process, anybody's."""
    return request_id in _running


def answer_stop(*, owner_key: str, request_id: str) -> bool:
    """Stop ``request_id`` at once if this process runs it for ``owner_key``,
    listened to or not (the student pressed Stop). What was said is stored as for any other
    early end. True when there was such an answer to stop."""
    answer = _running.get(request_id)
    if answer is None or answer.owner_key != owner_key or answer.finished:
        return False
    answer.stop()
    return True


def answer_preempt(*, owner_key: str, request_id: str) -> bool:
    """Stop ``request_id`` if this process runs it for ``owner_key`` and its
    listeners have all gone (its student moved on to a new question). True when it was stopped.

    An answer nobody has listened to yet is not abandoned: its response is about to (the
    ``django`` path's response starts reading only once the view has returned it)."""
    answer = _resumable.get((owner_key, request_id))
    if answer is None or not answer.abandoned or answer.finished:
        return False
    answer.preempt()
    return True


def answer_find(*, owner_key: str, request_id: str) -> LiveAnswer | None:
    """The answer to resume, if it is still kept, complete, and ``owner_key``'s."""
    now = time.monotonic()
    _expire(now)
    answer = _resumable.get((owner_key, request_id))
    if answer is None or not answer.complete:
        return None
    if isinstance(answer, KeptAnswer) and answer.until <= now:
        return None  # behind one kept longer (the keep time was changed meanwhile)
    return answer
