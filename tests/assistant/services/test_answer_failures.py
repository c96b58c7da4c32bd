"""The answer runner when the server itself fails, in-process, on real answers: a fault while
the frames are made, the stream slot's store failing at the end, the metrics failing as it
closes, and a live listener whose send fails. Each must end the way a student and the dashboard
can tell: an ``error`` frame ``server_error`` where the stream can still carry it, the outcome
of the first failure stored, and every word the engine produced stored with the question.

The faults are made where no real input can make them (a wire format that raises, a slot store
that raises, metrics that raise, a send that raises): they stand in for a bug and for Redis, a
file or a socket going away.
"""

import logging

import pytest

from assistant.engines.scripted import default_tokens
from assistant.services import answer_close
from assistant.services.frames import Frames
from tests.assistant.services.answer_support import (
    OPEN,
    Frame,
    Harness,
    Live,
    Outcome,
    assert_meta,
    assert_tokens,
    question,
)

pytestmark = pytest.mark.django_db(transaction=True)

SERVER_ERROR = Frame(
    "error", {"code": "server_error", "message": "The server failed while answering."}
)


class FaultyFrames(Frames):
    """The page's frames, but making token ``at`` raises (a bug in a wire format)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def token(self, text: str, token_id: int) -> bytes:
        if token_id == self.at:
            raise RuntimeError("a fault while making a frame")
        return super().token(text, token_id)


class FailingSend(Live):
    """A live listener whose send fails on frame ``at`` (counted from 1: ``: open``)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    async def __call__(self, frame: bytes) -> None:
        if len(self.frames) + 1 == self.at:
            raise ConnectionResetError("the socket went away")
        await super().__call__(frame)


@pytest.fixture
def release_fails(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Giving the stream slot back raises (the slot store went away); the request ids it was
    asked for are listed."""
    asked: list[str] = []

    async def failing(*, owner_key: str, request_id: str) -> None:
        asked.append(request_id)
        raise ConnectionError("the slot store went away")

    monkeypatch.setattr(answer_close, "chat_slot_release", failing)
    return asked


async def test_a_fault_after_tokens_ends_with_server_error_and_stores_what_was_said(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The tokens before the fault reach the listener, then ``server_error``; the fault is
    logged with its traceback, the outcome is ``server_error``, and the question and the
    engine's words up to the fault are stored."""
    answer = await harness.start(question("fault", tokens=5))
    answer.frames = FaultyFrames(at=3)
    live = Live()
    with caplog.at_level(logging.ERROR, logger="assistant.services.answer"):
        await harness.ended(harness.run(answer, live))

    frames = live.read
    assert frames[0] == OPEN
    assert_meta(frames[1], answer, path="direct")
    assert_tokens(frames[2:4], default_tokens(2))
    assert frames[4:] == [SERVER_ERROR]
    (crash,) = [r for r in caplog.records if answer.request_id in r.getMessage()]
    assert crash.exc_info is not None and crash.exc_info[0] is RuntimeError

    stored = await harness.stored(answer)
    assert stored.question.content.endswith("How do plants make food?")
    assert stored.answer.content == "".join(default_tokens(3))
    assert (stored.record.outcome, stored.record.error_code) == (
        Outcome.SERVER_ERROR,
        "server_error",
    )
    assert stored.record.tokens == 2


@pytest.mark.parametrize(
    ("extra", "said", "outcome", "code"),
    [
        ("", 4, Outcome.SERVER_ERROR, "server_error"),
        (" fail_after=2", 2, Outcome.ENGINE_ERROR, "engine_error"),
    ],
    ids=["after-a-whole-answer", "after-an-engine-failure"],
)
async def test_a_slot_store_failing_at_the_end_keeps_the_first_failure(
    harness: Harness, release_fails: list[str], extra: str, said: int, outcome: Outcome, code: str
) -> None:
    """The slot could not be given back at the end: the stream ends with ``server_error``
    (instead of ``done``, or of the engine's error), the release is tried once, and what the
    engine said is stored. The outcome is the first failure: ``server_error`` after a whole
    answer, the engine's ``engine_error`` when the engine failed first."""
    answer = await harness.start(question("release", tokens=4, extra=extra))
    live = Live()
    await harness.ended(harness.run(answer, live))

    frames = live.read
    assert_tokens(frames[2:-1], default_tokens(said))
    assert frames[-1] == SERVER_ERROR
    assert release_fails == [answer.request_id]

    stored = await harness.stored(answer)
    assert stored.answer.content == "".join(default_tokens(said))
    assert (stored.record.outcome, stored.record.error_code) == (outcome, code)
    assert stored.record.tokens == said


async def test_metrics_failing_as_the_answer_closes_still_store_what_was_said(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting and logging the answer raises (the metrics' shared file went away): the run
    ends with that error, and the question and the whole answer are stored all the same."""

    def failing(summary: object) -> None:
        raise OSError("the metrics file went away")

    monkeypatch.setattr(answer_close, "stream_observe", failing)
    answer = await harness.start(question("metrics", tokens=3))
    with pytest.raises(OSError, match="metrics file"):
        await harness.ended(harness.run(answer, Live()))

    stored = await harness.stored(answer)
    assert stored.question.content.endswith("How do plants make food?")
    assert stored.answer.content == "".join(default_tokens(3))


async def test_a_send_that_fails_ends_the_run_with_its_error_and_stores_the_answer(
    harness: Harness,
) -> None:
    """A live listener whose send raises (its socket went away) ends ``run`` with that error,
    for the transport to see; nothing is recorded as the server's fault, and the question and
    the engine's words so far are stored."""
    answer = await harness.start(question("send", tokens=5))
    live = FailingSend(at=4)  # : open with meta, tokens 1 and 2, then token 3 fails
    task = harness.run(answer, live)
    with pytest.raises(ConnectionResetError):
        await harness.ended(task)

    assert_tokens(live.read[2:], default_tokens(2))
    assert answer.finished
    stored = await harness.stored(answer)
    assert stored.answer.content == "".join(default_tokens(3))
    assert (stored.record.outcome, stored.record.error_code) == (Outcome.CLIENT_ABORT, "")
    assert stored.record.tokens == 2
