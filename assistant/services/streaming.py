"""One chat stream, from a validated request to SSE frames.

The order of work is the product:

* A new conversation needs nothing from the database before the model can start, so the engine
  is started first and the session is resolved while it works. A continued conversation needs
  its history first: one read on a reader thread, then the engine.
* ``: open`` and ``meta`` go out as soon as the session is known (the session cookie, if a new
  one was needed, must be in the headers); each delta becomes one frame the moment the engine
  yields it.
* The question is stored once the first token is out and the answer when the stream ends, in
  tasks that outlive the request, so no database write sits between the engine and the screen.
"""

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from assistant import errors, sse
from assistant.db import run_db
from assistant.engines import (
    BaseEngine,
    ChatMessage,
    Delta,
    EngineError,
    EngineTimeout,
)
from assistant.errors import Rejected
from assistant.models import Message
from assistant.services import background
from assistant.services.admission import (
    cache_in_process,
    chat_admit,
    chat_release,
    chat_slot_wait,
)
from assistant.services.chat_request import ChatTurn
from assistant.services.conversations import (
    ConversationNotFound,
    Exchange,
    answer_rows,
    conversation_history,
    question_rows,
)
from assistant.services.frames import error_frame, queue_frame, server_error_frame
from assistant.services.identity import Identity, identity_resolve
from assistant.services.persistence import Rows, rows_store
from assistant.services.resume import ResumableStream
from assistant.services.telemetry import stream_observe, stream_record, stream_started
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
            await _engine_stop(self.pending, self.deltas)
        finally:
            self.engine.release()
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


async def _engine_stop(pending: asyncio.Future[Delta] | None, deltas: AsyncIterator[Delta]) -> None:
    """Cancel the engine's step in flight, if any, then close its stream (stops generation)."""
    if pending is not None and not pending.done():
        pending.cancel()
        await asyncio.wait({pending})
    await deltas.aclose()  # type: ignore[attr-defined]


def _messages(question: str, history: list[ChatMessage]) -> list[ChatMessage]:
    system = settings.CHATSITE_STREAM["SYSTEM_PROMPT"]
    head = [ChatMessage(role="system", content=system)] if system else []
    return [*head, *history, ChatMessage(role="user", content=question)]


def _identity_admitted(session_key: str | None, request_id: str) -> tuple[Identity, bool]:
    """Who is asking, if their rate allows another stream (else ``Rejected``, 429), and
    whether a stream slot was taken."""
    identity = identity_resolve(session_key)
    return identity, chat_admit(owner_key=identity.owner_key, request_id=request_id)


def _identity_and_history(
    session_key: str | None, conversation_id: uuid.UUID, request_id: str
) -> tuple[Identity, bool, list[ChatMessage]]:
    identity, slot_taken = _identity_admitted(session_key, request_id)
    try:
        history = _history(identity, conversation_id)
    except BaseException:
        chat_release(owner_key=identity.owner_key, request_id=request_id)
        raise
    return identity, slot_taken, history


def _history(identity: Identity, conversation_id: uuid.UUID) -> list[ChatMessage]:
    return conversation_history(
        owner_key=identity.owner_key,
        conversation_id=conversation_id,
        limit=settings.CHATSITE_STREAM["HISTORY_MESSAGES"],
    )


class SlowClient(Exception):
    """The client left more than ``MAX_UNSENT_BYTES`` of the stream unread."""


def _release_once_known(found: asyncio.Future[Any], request_id: str) -> None:
    """The request is gone or refused before its stream started: give back the stream slot
    that the identity lookup (still running on its thread, perhaps) or the wait for one took,
    once known (giving back a slot it does not hold changes nothing)."""

    async def release() -> None:
        try:
            result = await found
        except BaseException:
            return  # refused or failed: it took no slot
        identity = result[0] if isinstance(result, tuple) else result
        await run_db(chat_release, owner_key=identity.owner_key, request_id=request_id)

    background.spawn(release(), name=f"release:{request_id}")


async def chat_stream_open(
    *,
    turn: ChatTurn,
    session_key: str | None,
    engine: BaseEngine,
    path: str,
    request_id: str,
    timings: StreamTimings,
    connection: ClientConnection | None = None,
) -> ChatStream:
    """Start the engine on ``turn`` and resolve who is asking. Close the result when done.

    Raises ``EngineBusy`` when the engine is full, ``Rejected`` when the student's own limits
    refuse another stream or the conversation is not theirs.
    """
    params = engine.generation
    timings.parsed = now()
    pending: asyncio.Future[Delta] | None = None
    engine.admit()
    try:
        if turn.conversation_id is None:
            identity_found = asyncio.ensure_future(
                run_db(_identity_admitted, session_key, request_id)
            )
            deltas = engine.stream(_messages(turn.message, []), params)
            timings.engine_submitted = now()
            pending = asyncio.ensure_future(anext(deltas))
            try:
                # Shielded: if this request is cancelled meanwhile, the lookup (which may take
                # a stream slot) still finishes, and _release_once_known gives the slot back.
                identity, slot_taken = await asyncio.shield(identity_found)
                if not slot_taken:
                    await chat_slot_wait(owner_key=identity.owner_key, request_id=request_id)
            except BaseException:
                _release_once_known(identity_found, request_id)
                await _engine_stop(pending, deltas)
                raise
        else:
            found = asyncio.ensure_future(
                run_db(_identity_and_history, session_key, turn.conversation_id, request_id)
            )
            try:
                identity, slot_taken, history = await asyncio.shield(found)
                if not slot_taken:
                    await chat_slot_wait(owner_key=identity.owner_key, request_id=request_id)
            except ConversationNotFound:
                raise Rejected(errors.CONVERSATION_NOT_FOUND) from None
            except BaseException:
                _release_once_known(found, request_id)
                raise
            deltas = engine.stream(_messages(turn.message, history), params)
            timings.engine_submitted = now()
    except BaseException:
        engine.release()
        raise
    stream_started(path=path, engine=engine.name)
    exchange = Exchange(
        conversation_id=turn.conversation_id or uuid.uuid4(),
        user_message_id=uuid.uuid4(),
        answer_message_id=uuid.uuid4(),
        is_new_conversation=turn.conversation_id is None,
        request_id=request_id,
    )
    return ChatStream(
        exchange=exchange,
        identity=identity,
        question=turn.message,
        path=path,
        engine=engine,
        deltas=deltas,
        timings=timings,
        pending=pending,
        connection=connection,
    )


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
            limit = next_limit if timings.tokens else first_limit
            try:
                async with asyncio.timeout(limit):
                    delta = await stream.next_delta()
            except StopAsyncIteration:
                break
            except TimeoutError:
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
