"""One chat stream, from a started engine to SSE frames (``stream_start`` opens it).

* ``: open`` and ``meta`` go out as soon as the session is known; each delta becomes one frame
  the moment the engine yields it.
* The question is stored once the first token is out and the answer when the stream ends, in
  tasks that outlive the request, so no database write sits between the engine and the screen.
* An answer can be given up from outside (``ChatStream.give_up``) when its seat on a full engine
  goes to another request (``services/seats.py``); it then ends with an ``error`` event.
"""

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass, field

from django.conf import settings

from assistant import errors, sse
from assistant.db import run_db
from assistant.engines import (
    BaseEngine,
    Delta,
    EngineError,
    EngineTimeout,
)
from assistant.models import Message
from assistant.services import background
from assistant.services.admission import (
    cache_in_process,
    chat_release,
)
from assistant.services.conversations import (
    Exchange,
    answer_rows,
    question_rows,
)
from assistant.services.frames import error_frame, queue_frame, server_error_frame
from assistant.services.identity import Identity
from assistant.services.persistence import Rows, rows_store
from assistant.services.resume import ResumableStream
from assistant.services.seats import Seat
from assistant.services.telemetry import stream_observe, stream_record
from assistant.services.timings import StreamTimings, now
from assistant.transport import ClientConnection

logger = logging.getLogger(__name__)

#: Half of a UTF-16 pair without the other: not encodable, shown as U+FFFD instead.
_UNPAIRED = re.compile("[\ud800-\udfff]")


@dataclass(slots=True)
class ChatStream:
    """One running answer: the engine's stream, what was said, and where it is stored."""

    exchange: Exchange
    identity: Identity
    question: str
    path: str
    engine: BaseEngine
    deltas: AsyncIterator[Delta]
    timings: StreamTimings
    #: Its place on the engine, given back when it ends.
    seat: Seat
    #: The client's connection, to notice a reader that stopped reading (None: unguarded).
    connection: ClientConnection | None = None
    #: The engine's next delta, already asked for.
    pending: asyncio.Future[Delta] | None = None
    answer: list[str] = field(default_factory=list)
    outcome: str = "client_abort"
    finish_reason: str = ""
    question_stored: bool = False
    slot_released: bool = False
    closed: bool = False
    #: Why the answer was given up to let another request in ("": it was not).
    given_up: str = ""
    #: The limit on the wait for the engine's next delta, while it is being waited for.
    deadline: asyncio.Timeout | None = None

    def __post_init__(self) -> None:
        self.seat.give_up = self.give_up

    def heard_by(self, resumable: ResumableStream) -> None:
        """The answer's frames go to ``resumable``: nobody hears it once that has no listener."""
        self.seat.unheard = lambda: resumable.abandoned

    def give_up(self, reason: str) -> None:
        """End the answer now with an ``error`` event for ``reason``: its seat went to another
        request. The wait for the next delta ends at once; a frame being sent goes first."""
        if self.given_up or self.closed:
            return
        self.given_up = reason
        deadline = self.deadline
        if deadline is not None and not deadline.expired():
            deadline.reschedule(asyncio.get_running_loop().time())

    def next_delta(self) -> Awaitable[Delta]:
        """The engine's next delta: the one already asked for, else a plain ``anext``
        (no task per token; cancelling the caller cancels the engine's step too)."""
        pending, self.pending = self.pending, None
        return pending if pending is not None else anext(self.deltas)

    def save_question(self) -> None:
        """Hand the question to the group writer, once (it stores it before the answer)."""
        if not self.question_stored:
            self.question_stored = True
            rows = question_rows(
                owner_key=self.identity.owner_key, exchange=self.exchange, question=self.question
            )
            background.spawn(rows_store(rows), name=f"question:{self.exchange.request_id}")

    async def aclose(self) -> None:
        """Stop the engine and store what was said. Idempotent; safe while being cancelled."""
        if self.closed:
            return
        self.closed = True
        try:
            await engine_stop(self.pending, self.deltas)
        finally:
            self.seat.leave()
            self.timings.finished = self.timings.finished or now()
            stream_observe(self)
            self.save_question()
            request_id = self.exchange.request_id
            background.spawn(_answer_persist(self), name=f"answer:{request_id}")
            if not self.slot_released:
                background.spawn(self.release_slot(), name=f"release:{request_id}")

    async def release_slot(self) -> None:
        """Give back the student's stream slot (once): before the last frame goes out, so a
        question asked the moment ``done`` arrives is not refused."""
        if not self.slot_released:
            self.slot_released = True
            if not settings.CHATSITE_STREAM["STREAMS_PER_SESSION"]:
                return  # no slots to give back: no trip to a thread
            owner_key, request_id = self.identity.owner_key, self.exchange.request_id
            try:
                if cache_in_process():
                    chat_release(owner_key=owner_key, request_id=request_id)  # microseconds
                else:
                    await run_db(chat_release, owner_key=owner_key, request_id=request_id)
            except Exception:  # the slot frees itself after SLOT_TTL_S; the answer is fine
                logger.exception("Could not give back the stream slot of %s", request_id)


async def engine_stop(pending: asyncio.Future[Delta] | None, deltas: AsyncIterator[Delta]) -> None:
    """Cancel the engine's step in flight, if any, then close its stream (stops generation)."""
    if pending is not None and not pending.done():
        pending.cancel()
        await asyncio.wait({pending})
    await deltas.aclose()  # type: ignore[attr-defined]


class SlowClient(Exception):
    """The client left more than ``MAX_UNSENT_BYTES`` of the stream unread."""


class GivenUp(Exception):
    """The answer's seat went to another request (``seats.UNHEARD``, ``seats.FAIR_SHARE``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def meta_frame(stream: ChatStream) -> bytes:
    exchange = stream.exchange
    return sse.encode_json_event(
        {
            "request_id": exchange.request_id,
            "conversation": str(exchange.conversation_id),
            "message": str(exchange.answer_message_id),
            "user_message": str(exchange.user_message_id),
            "path": stream.path,
            "engine": stream.engine.name,
        },
        event="meta",
    )


async def chat_stream_frames(stream: ChatStream) -> AsyncIterator[bytes]:
    """The response body, frame by frame (pings come from a ``Heartbeat`` beside it).
    Ends by closing ``stream``."""
    timings = stream.timings
    try:
        yield sse.encode_comment("open")
        yield meta_frame(stream)
        config = settings.CHATSITE_STREAM
        first_limit, next_limit = config["FIRST_TOKEN_TIMEOUT"], config["TOKEN_TIMEOUT"]
        max_unsent = config["MAX_UNSENT_BYTES"]
        while True:
            if stream.given_up:
                raise GivenUp(stream.given_up)
            limit = next_limit if timings.tokens else first_limit
            try:
                async with asyncio.timeout(limit) as stream.deadline:
                    delta = await stream.next_delta()
            except StopAsyncIteration:
                break
            except TimeoutError:
                if stream.given_up:
                    raise GivenUp(stream.given_up) from None
                stage = "token" if timings.tokens else "first_token"
                message = f"no {stage} within {limit:g} s"
                raise EngineTimeout(message, code=f"{stage}_timeout") from None
            if delta.queue_position is not None:
                yield queue_frame(delta.queue_position)
                continue
            if delta.finish_reason:
                stream.finish_reason = delta.finish_reason
            if not delta.text:
                continue
            if not timings.tokens:
                timings.engine_first_delta = now()
            text = _UNPAIRED.sub("\ufffd", delta.text)
            stream.answer.append(text)
            yield sse.encode_json_event({"text": text}, event="token", id=str(timings.tokens + 1))
            timings.token_sent(now())
            stream.save_question()
            connection = stream.connection  # None once the client is gone (resume grace)
            if connection is not None and connection.unsent() > max_unsent:
                raise SlowClient(f"{connection.unsent()} bytes unread")
        stream.outcome = "ok"
        timings.finished = now()
        await stream.release_slot()
        yield sse.encode_json_event(
            {
                "finish_reason": stream.finish_reason or "stop",
                "tokens": timings.tokens,
                "timings": timings.as_ms(),
            },
            event="done",
        )
    except EngineError as exc:
        timed_out = isinstance(exc, EngineTimeout)
        stream.outcome = "timeout" if timed_out else "engine_error"
        stream.finish_reason = exc.code
        timings.finished = now()
        logger.warning("Engine failed on %s: %s", stream.exchange.request_id, exc)
        if timed_out:
            failed = errors.ENGINE_TIMEOUT
        else:
            failed = errors.ENGINE_FAILED if timings.tokens else errors.ENGINE_UNAVAILABLE
        await stream.release_slot()
        yield error_frame(exc.code, failed.message)
    except GivenUp as exc:
        stream.outcome = "given_up"
        stream.finish_reason = exc.reason
        timings.finished = now()
        logger.info("Gave up %s (%s) for another request", stream.exchange.request_id, exc.reason)
        await stream.release_slot()
        yield error_frame(exc.reason, errors.GIVEN_UP[exc.reason].message)
    except SlowClient as exc:
        # Nothing more can reach this reader; drop it with what is still buffered for it.
        stream.outcome = stream.finish_reason = "slow_client"
        timings.finished = now()
        logger.warning(
            "Dropped a client that stopped reading %s: %s", stream.exchange.request_id, exc
        )
        if stream.connection is not None:
            stream.connection.abort()
        await stream.release_slot()
        # Kept for a resume (which then ends here), never reaches the aborted connection.
        yield error_frame("slow_client", "The connection could not keep up with the answer.")
    except Exception:
        stream.outcome = stream.finish_reason = "server_error"
        raise
    finally:
        stream.deadline = None  # it holds this task
        await stream.aclose()


async def chat_stream_body(stream: ChatStream) -> AsyncIterator[bytes]:
    """``chat_stream_frames``, ending with an ``error`` event if the server itself fails."""
    try:
        async with aclosing(chat_stream_frames(stream)) as frames:
            async for frame in frames:
                yield frame
    except Exception:
        logger.exception("Chat stream %s crashed", stream.exchange.request_id)
        yield server_error_frame()


async def chat_stream_into(stream: ChatStream, resumable: ResumableStream) -> None:
    """Run ``stream`` to its end into ``resumable``, whoever listens (a serving path that reads
    its response from the buffer). Cancelling this stops the answer."""
    try:
        async with aclosing(chat_stream_body(stream)) as frames:
            async for frame in frames:
                resumable.append(frame)
    finally:
        try:
            await stream.aclose()
        finally:
            resumable.finish()


async def _answer_persist(stream: ChatStream) -> None:
    content = "".join(stream.answer)
    if stream.outcome == "ok":
        status = Message.Status.COMPLETE
    else:
        status = Message.Status.PARTIAL if content else Message.Status.FAILED
    rows = answer_rows(
        exchange=stream.exchange,
        content=content,
        status=status,
        finish_reason=stream.finish_reason or stream.outcome,
    )
    # Written after the question by the same writer; if the question failed, so does this. The
    # record is submitted apart (usually in the same transaction): a request id used twice must
    # not cost the answer.
    await asyncio.gather(rows_store(rows), rows_store(Rows(records=[stream_record(stream)])))
