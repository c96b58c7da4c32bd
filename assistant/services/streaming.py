"""One chat stream, from a validated request to SSE frames.

The order of work is the product: the ``: open`` comment and ``meta`` go out before the engine is
called; each delta becomes one frame the moment the engine yields it; the question is stored
concurrently with generation and the answer after it, in tasks that outlive the request, so no
database write ever sits between the engine's first token and the student's screen.
"""

import asyncio
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from django.conf import settings

from assistant import errors, sse
from assistant.db import run_db, run_db_write
from assistant.engines import BaseEngine, ChatMessage, EngineError, GenerationParams
from assistant.models import Message
from assistant.services import background
from assistant.services.conversations import (
    ConversationNotFound,
    Exchange,
    answer_save,
    conversation_history,
    exchange_begin,
)
from assistant.services.identity import identity_resolve
from assistant.services.timings import StreamTimings, now

logger = logging.getLogger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


class RequestRejected(Exception):
    """The request cannot start a stream; ``error`` says why, with its HTTP status."""

    def __init__(self, error: errors.ApiError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, slots=True)
class ChatTurn:
    message: str
    conversation_id: uuid.UUID | None


@dataclass(slots=True)
class ChatStream:
    """Everything one stream needs, settled before the first byte of the response."""

    exchange: Exchange
    owner_key: str
    question: str
    history: list[ChatMessage]
    path: str
    engine: BaseEngine
    params: GenerationParams
    timings: StreamTimings
    set_cookie: str | None = None
    answer: list[str] = field(default_factory=list)


def request_id_choose(incoming: str | None) -> str:
    """Reuse a proxy's request id when it looks like one, so logs join up; else a new one."""
    if incoming and _REQUEST_ID.match(incoming):
        return incoming
    return uuid.uuid4().hex


def chat_turn_parse(body: bytes) -> ChatTurn:
    """Validate the JSON body ``{"message": str, "conversation": uuid | null}``."""
    config = settings.CHATSITE_STREAM
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestRejected(errors.INVALID_JSON) from None
    if not isinstance(payload, dict):
        raise RequestRejected(errors.INVALID_BODY)
    message = payload.get("message")
    if message is not None and not isinstance(message, str):
        raise RequestRejected(errors.INVALID_BODY)
    if not message or not message.strip():
        raise RequestRejected(errors.MESSAGE_MISSING)
    limit = config["MAX_MESSAGE_CHARS"]
    if len(message) > limit:
        raise RequestRejected(
            errors.MESSAGE_TOO_LONG.with_message(f"The message is longer than {limit} characters.")
        )
    raw_conversation = payload.get("conversation")
    conversation_id = None
    if raw_conversation is not None:
        try:
            conversation_id = uuid.UUID(str(raw_conversation))
        except ValueError:
            raise RequestRejected(errors.INVALID_CONVERSATION) from None
        if not isinstance(raw_conversation, str):
            raise RequestRejected(errors.INVALID_CONVERSATION)
    return ChatTurn(message=message, conversation_id=conversation_id)


def _prepare_sync(
    session_key: str | None, conversation_id: uuid.UUID | None
) -> tuple[str, str | None, list[ChatMessage]]:
    identity = identity_resolve(session_key)
    history: list[ChatMessage] = []
    if conversation_id is not None:
        history = conversation_history(
            owner_key=identity.owner_key,
            conversation_id=conversation_id,
            limit=settings.CHATSITE_STREAM["HISTORY_MESSAGES"],
        )
    return identity.owner_key, identity.set_cookie, history


async def chat_stream_prepare(
    *,
    turn: ChatTurn,
    session_key: str | None,
    engine: BaseEngine,
    path: str,
    request_id: str,
    timings: StreamTimings,
) -> ChatStream:
    """Resolve who is asking and the conversation so far: one worker-thread trip, no writes."""
    try:
        owner_key, set_cookie, history = await run_db(
            _prepare_sync, session_key, turn.conversation_id
        )
    except ConversationNotFound:
        raise RequestRejected(errors.CONVERSATION_NOT_FOUND) from None
    config = settings.CHATSITE_STREAM
    exchange = Exchange(
        conversation_id=turn.conversation_id or uuid.uuid4(),
        user_message_id=uuid.uuid4(),
        answer_message_id=uuid.uuid4(),
        is_new_conversation=turn.conversation_id is None,
        request_id=request_id,
    )
    timings.parsed = now()
    return ChatStream(
        exchange=exchange,
        owner_key=owner_key,
        question=turn.message,
        history=history,
        path=path,
        engine=engine,
        params=GenerationParams(max_tokens=config["MAX_TOKENS"], temperature=config["TEMPERATURE"]),
        timings=timings,
        set_cookie=set_cookie,
    )


def _prompt(stream: ChatStream) -> list[ChatMessage]:
    system = settings.CHATSITE_STREAM["SYSTEM_PROMPT"]
    head = [ChatMessage(role="system", content=system)] if system else []
    return [*head, *stream.history, ChatMessage(role="user", content=stream.question)]


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


def error_frame(code: str, message: str) -> bytes:
    return sse.encode_json_event({"code": code, "message": message}, event="error")


async def chat_stream_frames(stream: ChatStream) -> AsyncIterator[bytes]:
    """The response body, frame by frame. Close it (``aclosing``) to stop the engine."""
    timings = stream.timings
    ping_interval = settings.CHATSITE_STREAM["PING_INTERVAL"]
    # The question is stored once the first token is out (or the stream ends without one): a
    # write started earlier would compete with the first token for the GIL and the loop.
    question_saved: asyncio.Task[None] | None = None
    outcome, finish_reason = "client_abort", ""
    yield sse.encode_comment("open")
    yield meta_frame(stream)
    deltas = stream.engine.stream(_prompt(stream), stream.params)
    timings.engine_submitted = now()
    pending: asyncio.Future | None = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(deltas))
            # Wait for the next delta without cancelling it; speak up if it takes long.
            while not (await asyncio.wait({pending}, timeout=ping_interval))[0]:
                yield sse.encode_comment("ping")
            try:
                delta = pending.result()
            except StopAsyncIteration:
                break
            finally:
                pending = None
            if delta.finish_reason:
                finish_reason = delta.finish_reason
            if not delta.text:
                continue
            if not timings.tokens:
                timings.engine_first_delta = now()
            stream.answer.append(delta.text)
            yield sse.encode_json_event(
                {"text": delta.text}, event="token", id=str(timings.tokens + 1)
            )
            timings.token_sent(now())
            if question_saved is None:
                question_saved = _question_persist(stream)
        outcome = "ok"
        timings.finished = now()
        yield sse.encode_json_event(
            {
                "finish_reason": finish_reason or "stop",
                "tokens": timings.tokens,
                "timings": timings.as_ms(),
            },
            event="done",
        )
    except EngineError as exc:
        outcome, finish_reason = "engine_error", exc.code
        timings.finished = now()
        logger.warning("Engine failed on %s: %s", stream.exchange.request_id, exc)
        message = (
            errors.ENGINE_UNAVAILABLE.message
            if not timings.tokens
            else errors.ENGINE_FAILED.message
        )
        yield error_frame(exc.code, message)
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending})
        await deltas.aclose()
        timings.finished = timings.finished or now()
        if question_saved is None:
            question_saved = _question_persist(stream)
        background.spawn(
            _answer_persist(stream, question_saved, outcome, finish_reason),
            name=f"answer:{stream.exchange.request_id}",
        )


def _question_persist(stream: ChatStream) -> asyncio.Task[None]:
    return background.spawn(
        run_db_write(
            exchange_begin,
            owner_key=stream.owner_key,
            exchange=stream.exchange,
            question=stream.question,
        ),
        name=f"question:{stream.exchange.request_id}",
    )


async def _answer_persist(
    stream: ChatStream, question_saved: asyncio.Task[None], outcome: str, finish_reason: str
) -> None:
    try:
        await question_saved
    except Exception:
        logger.exception("Question of %s was not saved; answer dropped", stream.exchange.request_id)
        return
    content = "".join(stream.answer)
    if outcome == "ok":
        status = Message.Status.COMPLETE
    else:
        status = Message.Status.PARTIAL if content else Message.Status.FAILED
    await run_db_write(
        answer_save,
        exchange=stream.exchange,
        content=content,
        status=status,
        finish_reason=finish_reason or outcome,
    )
