"""Starting an answer on a serving path: shared by the Channels consumer and the Django view.

Both paths hand over the raw body, the session cookie and the client's address and get back a
started ``Answer`` (``services/answer.py``) or a ``Rejected`` carrying the exact error to answer
with, so they can differ only in transport.

The order of work is the product: a new conversation needs nothing from the database before the
model can start, so (with a seat free on the engine) the engine is started first and the session
is resolved while it works. A continued conversation needs its history first: one read on a
reader thread, then the engine.
"""

import asyncio
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError

from assistant import errors
from assistant.db import run_db
from assistant.engines import (
    BaseEngine,
    ChatMessage,
    EngineBusy,
    EngineUnavailable,
    get_engine,
)
from assistant.errors import Rejected
from assistant.services import background
from assistant.services.admission import SlotTry, chat_admit, chat_release, chat_slot_wait
from assistant.services.answer import Answer
from assistant.services.answer_registry import answer_running
from assistant.services.chat_request import ChatTurn, ClassShown, chat_turn_parse
from assistant.services.class_live import class_live_start
from assistant.services.classrooms import (
    ClassContext,
    chat_rate_for,
    class_guess,
    class_paused_check,
    class_shown_check,
    generation_for,
    system_prompt,
)
from assistant.services.classrooms import engine_alias_for as class_engine_alias
from assistant.services.conversations import (
    ConversationNotFound,
    Exchange,
    conversation_history,
)
from assistant.services.engine_stream import EngineStream
from assistant.services.identity import Identity, identity_required, identity_resolve
from assistant.services.persistence import Rows, rows_store
from assistant.services.seats import Seat, Seating, seating_for
from assistant.services.serving_state import engine_alias_for
from assistant.services.telemetry import refused_record, stream_refused, stream_started
from assistant.services.timings import StreamTimings, now

logger = logging.getLogger(__name__)

#: What a refused request is told to wait: a full engine frees up fast, a broken one does not.
BUSY_RETRY_AFTER_S = 2
UNAVAILABLE_RETRY_AFTER_S = 10
DATABASE_RETRY_AFTER_S = 5


async def answer_start(
    *,
    body: bytes,
    session_key: str | None,
    class_hint: str | None,
    client: str,
    request_id: str,
    serving_path: str,
    timings: StreamTimings,
) -> Answer:
    """Validate ``body``, start ``serving_path``'s engine on it and resolve who is asking.

    A request without a session cookie is refused at once (403 ``session_required``): the
    page issues sessions, a limited number per address (``identity.session_issue``).

    ``class_hint`` (the class cookie) is the guess of the student's class that a new
    conversation's engine starts on before the session is read (``services/classrooms.py``).

    Raises ``Rejected`` for a request the client can fix (4xx) and for an engine that cannot
    take it now (503, counted and recorded like any failed stream).
    """
    known, guess = class_guess(class_hint)
    path_alias = engine_alias_for(serving_path)
    alias = class_engine_alias(path_alias, guess)
    engine_name = alias
    try:
        if session_key is None:
            raise Rejected(errors.SESSION_REQUIRED)
        # An id a client sent (the page makes one per question) names one answer: its resume,
        # its Stop. One already running here is refused; one a stored stream had is replaced
        # when this stream's record is stored (services/persistence.py).
        if answer_running(request_id):
            raise Rejected(errors.REQUEST_ID_USED)
        turn = chat_turn_parse(body)
        engine = get_engine(alias)
        if alias != path_alias and not _usable(engine):
            # The guessed class's own engine is down: the session may hold another class;
            # start nothing early, and decide once it is read.
            engine, known = get_engine(path_alias), False
        engine_name = engine.name
        engine.check()
        return await _answer_open(
            turn=turn,
            session_key=session_key,
            guess=guess,
            guess_known=known,
            client=client,
            engine=engine,
            serving_path=serving_path,
            request_id=request_id,
            timings=timings,
        )
    except (OperationalError, InterfaceError) as exc:
        logger.error("Database unavailable before %s started: %s", request_id, exc)
        raise Rejected(errors.DATABASE_UNAVAILABLE, retry_after=DATABASE_RETRY_AFTER_S) from None
    except EngineUnavailable as exc:
        engine_name = getattr(exc, "engine_name", engine_name)
        logger.warning("Engine %r unavailable for %s: %s", engine_name, request_id, exc)
        stream_refused(serving_path=serving_path, engine=engine_name, reason=exc.code)
        background.spawn(
            _refused_persist(
                session_key=session_key,
                request_id=request_id,
                serving_path=serving_path,
                engine=engine_name,
                reason=exc.code,
                timings=timings,
            ),
            name=f"refused:{request_id}",
        )
        if isinstance(exc, EngineBusy):
            raise Rejected(errors.ENGINE_BUSY, retry_after=BUSY_RETRY_AFTER_S) from None
        raise Rejected(errors.ENGINE_UNAVAILABLE, retry_after=UNAVAILABLE_RETRY_AFTER_S) from None


async def _refused_persist(
    *,
    session_key: str | None,
    request_id: str,
    serving_path: str,
    engine: str,
    reason: str,
    timings: StreamTimings,
) -> None:
    """A refused stream is a failed one: stored, so the breaker and the dashboard count it."""
    identity = await run_db(identity_resolve, session_key)
    record = refused_record(
        request_id=request_id,
        owner_key=identity.owner_key,
        classroom_id=identity.classroom_id,
        serving_path=serving_path,
        engine=engine,
        reason=reason,
        timings=timings,
    )
    await rows_store(Rows(records=[record]))


def _engine_check(engine: BaseEngine) -> None:
    """``engine.check()``, naming the engine on a refusal (the one the request started with may
    have been another: a guess)."""
    try:
        engine.check()
    except EngineUnavailable as exc:
        exc.engine_name = engine.name  # type: ignore[attr-defined]
        raise


def _usable(engine: BaseEngine) -> bool:
    """The engine can take a request now (its cheap check, no I/O)."""
    try:
        engine.check()
    except EngineUnavailable:
        return False
    return True


def _messages(
    question: str, history: list[ChatMessage], classroom: ClassContext | None
) -> list[ChatMessage]:
    system = system_prompt(classroom)
    head = [ChatMessage(role="system", content=system)] if system else []
    return [*head, *history, ChatMessage(role="user", content=question)]


def _identity_admitted(
    session_key: str | None, request_id: str, shown: ClassShown
) -> tuple[Identity, SlotTry]:
    """Who is asking (``Rejected``, 403, without a session), whether their class is open (403
    ``class_paused``) and the one their page showed (409 ``class_changed``), if their rate
    allows another stream (else ``Rejected``, 429), and what the try for a stream slot found."""
    identity = identity_required(session_key)
    class_paused_check(identity.classroom)
    class_shown_check(shown, identity.classroom)
    slot = chat_admit(
        owner_key=identity.owner_key,
        request_id=request_id,
        rate=chat_rate_for(identity.classroom),
    )
    return identity, slot


def _identity_and_history(
    session_key: str | None, turn: ChatTurn, request_id: str
) -> tuple[Identity, SlotTry, list[ChatMessage]]:
    assert turn.conversation_id is not None
    identity, slot = _identity_admitted(session_key, request_id, turn.shown)
    try:
        history = _history(identity, turn.conversation_id, before=turn.replaces)
    except BaseException:
        chat_release(owner_key=identity.owner_key, request_id=request_id)
        raise
    return identity, slot, history


def _history(
    identity: Identity, conversation_id: uuid.UUID, *, before: uuid.UUID | None
) -> list[ChatMessage]:
    return conversation_history(
        owner_key=identity.owner_key,
        classroom_id=identity.classroom_id,
        conversation_id=conversation_id,
        limit=settings.CHATSITE_STREAM["HISTORY_MESSAGES"],
        before=before,
    )


def _seat_early(seating: Seating, client: str) -> Seat | None:
    """A seat if one is free without stopping anybody's answer; None: decide once the session
    is known (only a known session may take a seat from another)."""
    try:
        return seating.take(client, evict=False)
    except (EngineBusy, Rejected):
        return None


def _release_once_known(found: asyncio.Future[Any], request_id: str) -> None:
    """The request is gone or refused before its stream started: give back the stream slot
    that the identity lookup (still running on its thread, perhaps) or the wait for one took,
    once known (giving back a slot it does not hold changes nothing)."""

    async def release() -> None:
        try:
            identity = (await found)[0]
        except BaseException:
            return  # refused or failed: it took no slot
        await run_db(chat_release, owner_key=identity.owner_key, request_id=request_id)

    background.spawn(release(), name=f"release:{request_id}")


def _engine_start(
    engine: BaseEngine,
    messages: list[ChatMessage],
    classroom: ClassContext | None,
    timings: StreamTimings,
    *,
    ask_now: bool,
) -> EngineStream:
    """Submit ``messages`` to ``engine`` with ``classroom``'s sampling; ``ask_now``: ask for the
    first delta at once, so the engine works while the session is looked up."""
    deltas = engine.stream(messages, generation_for(engine.generation, classroom))
    timings.engine_submitted = now()
    return EngineStream(deltas, asyncio.ensure_future(anext(deltas)) if ask_now else None)


async def _asker(
    found: asyncio.Future[Any], *, turn: ChatTurn, request_id: str
) -> tuple[Identity, list[ChatMessage]]:
    """Who is asking, once the lookup beside the engine (``found``) is done: with their history
    and a stream slot (waited for if need be)."""
    try:
        # Shielded: if this request is cancelled meanwhile, the lookup (which may take a
        # stream slot) still finishes, and _release_once_known gives the slot back.
        result = await asyncio.shield(found)
    except ConversationNotFound:
        raise Rejected(errors.CONVERSATION_NOT_FOUND) from None
    identity, slot = result[0], result[1]
    history = result[2] if turn.conversation_id is not None else []
    if not slot.taken:
        await chat_slot_wait(owner_key=identity.owner_key, request_id=request_id, tried=slot)
    return identity, history


async def _answer_open(
    *,
    turn: ChatTurn,
    session_key: str | None,
    guess: ClassContext | None,
    guess_known: bool,
    client: str,
    engine: BaseEngine,
    serving_path: str,
    request_id: str,
    timings: StreamTimings,
) -> Answer:
    """Start the engine on ``turn`` and resolve who is asking. Run the result to its end.

    ``guess`` is the student's class as the cookie names it (``guess_known`` False: the cookie
    names a class not read here yet): a new conversation starts on it before the session is
    read, and starts again should the session hold another class (or the class have changed).

    Raises ``EngineBusy`` when the engine is full, ``Rejected`` when the request has no session,
    the class is paused, the student's or the address's limits refuse another stream, or the
    conversation is not theirs.
    """
    timings.parsed = now()
    seating = seating_for(engine)
    early = guess_known and not (guess is not None and guess.paused)
    # With a seat free, a new conversation needs nothing from the database before the engine
    # starts; without one, the session must be known first (it may take another's seat).
    seat = _seat_early(seating, client) if early else None
    source: EngineStream | None = None
    found: asyncio.Future[Any] | None = None
    try:
        if turn.conversation_id is None:
            found = asyncio.ensure_future(
                run_db(_identity_admitted, session_key, request_id, turn.shown)
            )
            if seat is not None:
                messages = _messages(turn.message, [], guess)
                source = _engine_start(engine, messages, guess, timings, ask_now=True)
        else:
            found = asyncio.ensure_future(
                run_db(_identity_and_history, session_key, turn, request_id)
            )
        identity, history = await _asker(found, turn=turn, request_id=request_id)
        classroom = identity.classroom
        # The engine started on the class the session holds, as stored now (or on none)?
        if not (guess_known and guess == classroom):
            if source is not None:
                await source.close()
                source = None
            alias = class_engine_alias(engine_alias_for(serving_path), classroom)
            if alias != engine.alias:
                if seat is not None:
                    seat.leave()
                    seat = None
                engine = get_engine(alias)
                _engine_check(engine)
                seating = seating_for(engine)
        seat = seat or seating.take(client, evict=True)
        if source is None:
            messages = _messages(turn.message, history, classroom)
            source = _engine_start(engine, messages, classroom, timings, ask_now=False)
    except BaseException:
        if found is not None:
            _release_once_known(found, request_id)
        if source is not None:
            await source.close()
        if seat is not None:
            seat.leave()
        raise
    stream_started(serving_path=serving_path, engine=engine.name)
    exchange = Exchange(
        conversation_id=turn.conversation_id or uuid.uuid4(),
        user_message_id=uuid.uuid4(),
        answer_message_id=uuid.uuid4(),
        is_new_conversation=turn.conversation_id is None,
        request_id=request_id,
        replaces=turn.replaces,
    )
    answer = Answer(
        exchange=exchange,
        identity=identity,
        question=turn.message,
        serving_path=serving_path,
        engine=engine,
        source=source,
        timings=timings,
        seat=seat,
    )
    if identity.classroom is not None:
        class_live_start()  # the teacher's dashboard counts it
    return answer
