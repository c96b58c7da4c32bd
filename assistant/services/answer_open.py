"""Opening an answer, whichever serving path asks: the engine started, the asker admitted, the
``Answer`` (``services/answer.py``) made. The page's ``answer_start`` (``services/answer_start.py``)
and the API's ``api_answer_start`` (``services/api_answer.py``) each describe their question as an
``Asking`` and hand it to ``answer_begin``: they differ in who asks, what the engine is given and
the wire format, never in this order of work.

The order of work is the product: a new conversation needs nothing from the database before the
model can start, so (with a seat free on the engine) the engine is started first, on a guess of
the asker's class (the class cookie, or the key's last read in this process), its first step
going out at once, and the asker is admitted while it works: on a database thread, on the
loop where nothing that admission reads needs I/O (``Asking.admit_now``), or by the loop's own
Redis client where the server gave it one (``Asking.admit_on_loop``). A guess the read
disagrees with is closed before any token is sent. A continued conversation needs its history
first: one read, then the engine.
"""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError

from assistant import errors
from assistant.db import run_db
from assistant.engines import (
    BaseEngine,
    ChatMessage,
    Delta,
    EngineBusy,
    EngineUnavailable,
    GenerationParams,
    get_engine,
)
from assistant.errors import Rejected
from assistant.ids import ordered_uuid
from assistant.services import background
from assistant.services.admission import SlotTry, chat_release, chat_slot_wait
from assistant.services.answer import Answer
from assistant.services.answer_registry import answer_running
from assistant.services.class_live import class_live_start
from assistant.services.classrooms import ClassContext, generation_for
from assistant.services.classrooms import engine_alias_for as class_engine_alias
from assistant.services.conversations import ConversationNotFound, Exchange, conversation_written
from assistant.services.engine_stream import EngineStream
from assistant.services.frames import SITE_FRAMES, Frames
from assistant.services.identity import Identity
from assistant.services.persistence import Rows, rows_store
from assistant.services.seats import Seat, Seating, seating_for
from assistant.services.table_rows import Row
from assistant.services.telemetry import refused_record, stream_refused, stream_started
from assistant.services.timings import StreamTimings, now

logger = logging.getLogger(__name__)

#: What a refused request is told to wait: a full engine frees up fast, a broken one does not.
BUSY_RETRY_AFTER_S = 2
UNAVAILABLE_RETRY_AFTER_S = 10
DATABASE_RETRY_AFTER_S = 5


#: Who asks, their stream slot's try and their history: an admission's answer.
Admitted = tuple[Identity, SlotTry, list[ChatMessage]]


@dataclass(frozen=True, slots=True)
class Asking:
    """One question as a serving path hands it over: what is stored, how its asker is admitted,
    and how the engine is prompted. The page's (``answer_start``) and the API's
    (``services/api_answer.py``) differ only here."""

    #: What is stored as the question.
    question: str
    #: The conversation it continues (None: a new one, whose engine may start early).
    conversation_id: uuid.UUID | None
    replaces: uuid.UUID | None
    #: What its history read is completed with, of its conversation's rows not stored yet
    #: (``conversations.history_held``); None: the read waits for them to be stored.
    held: list[Row] | None
    #: Synchronous, on a database thread: who asks, their stream slot and their history;
    #: ``Rejected`` when they may not.
    admit: Callable[[], Admitted]
    #: The engine's messages, from the history and the asker's class.
    prompt: Callable[[list[ChatMessage], ClassContext | None], list[ChatMessage]]
    #: Synchronous: the asker, for the record of a refused stream (the empty owner: unknown).
    owner: Callable[[], Identity]
    #: ``admit``'s answer where it needs no I/O, tried on the event loop first (no trip to a
    #: thread); None from it: ``admit`` on a database thread.
    admit_now: Callable[[], Admitted | None] | None = None
    #: Tried next: ``admit``'s answer by the event loop's own client, as a coroutine (None: it
    #: cannot be tried); the coroutine's None: ``admit`` on a database thread.
    admit_on_loop: Callable[[], Coroutine[Any, Any, Admitted | None] | None] | None = None
    #: The sampling, from the engine alias's and the class's.
    sampling: Callable[[GenerationParams, ClassContext | None], GenerationParams] = generation_for
    frames: Frames = SITE_FRAMES
    holds_slot: bool = True
    resumable: bool = True


def request_id_check(request_id: str) -> None:
    """An id a client sent (the page makes one per question) names one answer: its resume,
    its Stop. One already running here is refused (409); one a stored stream had is replaced
    when this stream's record is stored (services/persistence.py)."""
    if answer_running(request_id):
        raise Rejected(errors.REQUEST_ID_USED)


async def answer_begin(
    asking: Asking,
    *,
    path_alias: str,
    guess: ClassContext | None,
    guess_known: bool,
    client: str,
    request_id: str,
    serving_path: str,
    timings: StreamTimings,
) -> Answer:
    """Start the engine of ``path_alias`` (or of the guessed class) on ``asking`` and admit its
    asker (``_answer_open``); a database or an engine that cannot take it is ``Rejected``
    (503, and an engine's refusal is counted and recorded like any failed stream)."""
    alias = class_engine_alias(path_alias, guess)
    engine_name = alias
    try:
        engine = get_engine(alias)
        if alias != path_alias and not _usable(engine):
            # The guessed class's own engine is down: the asker may be in another class;
            # start nothing early, and decide once they are known.
            engine, guess_known = get_engine(path_alias), False
        engine_name = engine.name
        engine.check()
        return await _answer_open(
            asking=asking,
            path_alias=path_alias,
            guess=guess,
            guess_known=guess_known,
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
        stream_refused(
            request_id=request_id,
            serving_path=serving_path,
            engine=engine_name,
            reason=exc.code,
            timings=timings,
        )
        background.spawn(
            _refused_persist(
                owner=asking.owner,
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
    owner: Callable[[], Identity],
    request_id: str,
    serving_path: str,
    engine: str,
    reason: str,
    timings: StreamTimings,
) -> None:
    """A refused stream is a failed one: stored, so the breaker and the dashboard count it."""
    identity = await run_db(owner)
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
    asking: Asking,
    history: list[ChatMessage],
    classroom: ClassContext | None,
    timings: StreamTimings,
    *,
    ask_now: bool,
) -> EngineStream:
    """Submit ``asking``'s prompt to ``engine`` with its sampling for ``classroom``; ``ask_now``:
    ask for the first delta at once, so the engine works while the asker is looked up."""
    messages = asking.prompt(history, classroom)
    deltas = engine.stream(messages, asking.sampling(engine.generation, classroom))
    timings.engine_submitted = now()
    if not ask_now:
        return EngineStream(deltas)
    # Started eagerly: the engine's first step (its request sent, its wait begun) runs now,
    # not at the loop's next turn, behind the asker's admission and whatever else is queued.
    first = asyncio.Task(_first_delta(deltas), loop=asyncio.get_running_loop(), eager_start=True)
    return EngineStream(deltas, first)


async def _first_delta(deltas: AsyncIterator[Delta]) -> Delta:
    return await anext(deltas)


def _admission(asking: Asking) -> asyncio.Future[Any]:
    """``asking``'s admission: known at once where ``admit_now`` can tell, else by the loop's
    own client where ``admit_on_loop`` can, else ``admit`` on a database thread (a future
    either way, which may hold a refusal)."""
    if asking.admit_now is not None:
        known = asyncio.get_running_loop().create_future()
        try:
            result = asking.admit_now()
        except Exception as exc:
            known.set_exception(exc)
            return known
        if result is not None:
            known.set_result(result)
            return known
    on_loop = asking.admit_on_loop() if asking.admit_on_loop is not None else None
    if on_loop is not None:
        return asyncio.ensure_future(_on_loop_else_thread(on_loop, asking))
    return asyncio.ensure_future(run_db(asking.admit))


async def _on_loop_else_thread(
    on_loop: Coroutine[Any, Any, Admitted | None], asking: Asking
) -> Admitted:
    admitted = await on_loop
    return admitted if admitted is not None else await run_db(asking.admit)


async def _asker(
    found: asyncio.Future[Any], *, request_id: str
) -> tuple[Identity, list[ChatMessage]]:
    """Who is asking, once the lookup beside the engine (``found``) is done: with their history
    and a stream slot (waited for if need be)."""
    try:
        # Shielded: if this request is cancelled meanwhile, the lookup (which may take a
        # stream slot) still finishes, and _release_once_known gives the slot back.
        result = await asyncio.shield(found)
    except ConversationNotFound:
        raise Rejected(errors.CONVERSATION_NOT_FOUND) from None
    identity, slot, history = result
    if not slot.taken:
        await chat_slot_wait(owner_key=identity.owner_key, request_id=request_id, tried=slot)
    return identity, history


async def _answer_open(
    *,
    asking: Asking,
    path_alias: str,
    guess: ClassContext | None,
    guess_known: bool,
    client: str,
    engine: BaseEngine,
    serving_path: str,
    request_id: str,
    timings: StreamTimings,
) -> Answer:
    """Start the engine on ``asking`` and admit its asker. Run the result to its end.

    ``guess`` is the asker's class as its cookie (or its key, read before here) names it
    (``guess_known`` False: not read here yet): a new conversation starts on it before the
    asker is read, and starts again should they be in another class (or the class have
    changed).

    Raises ``EngineBusy`` when the engine is full, ``Rejected`` when ``asking.admit`` refuses
    (no session, a paused class, a limit, a conversation that is not theirs).
    """
    timings.parsed = now()
    if asking.conversation_id is not None and asking.held is None:
        # Its last answer may still be on its way to the database, with rows that cannot
        # complete the history read (``held``): the read must find them stored. (Holding
        # nothing yet: no seat, no slot.)
        await conversation_written(asking.conversation_id)
    seating = seating_for(engine)
    early = guess_known and not (guess is not None and guess.paused)
    # With a seat free, a new conversation needs nothing from the database before the engine
    # starts; without one, the asker must be known first (they may take another's seat).
    seat = _seat_early(seating, client) if early else None
    source: EngineStream | None = None
    found: asyncio.Future[Any] | None = None
    try:
        if seat is not None and asking.conversation_id is None:
            source = _engine_start(engine, asking, [], guess, timings, ask_now=True)
        found = _admission(asking)
        identity, history = await _asker(found, request_id=request_id)
        classroom = identity.classroom
        # The engine started on the class the asker is in, as stored now (or on none)?
        if not (guess_known and guess == classroom):
            if source is not None:
                await source.close()
                source = None
            alias = class_engine_alias(path_alias, classroom)
            if alias != engine.alias:
                if seat is not None:
                    seat.leave()
                    seat = None
                engine = get_engine(alias)
                _engine_check(engine)
                seating = seating_for(engine)
        seat = seat or seating.take(client, evict=True)
        if source is None:
            source = _engine_start(engine, asking, history, classroom, timings, ask_now=False)
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
        conversation_id=asking.conversation_id or ordered_uuid(),
        user_message_id=ordered_uuid(),
        answer_message_id=ordered_uuid(),
        is_new_conversation=asking.conversation_id is None,
        request_id=request_id,
        replaces=asking.replaces,
    )
    answer = Answer(
        exchange=exchange,
        identity=identity,
        question=asking.question,
        serving_path=serving_path,
        engine=engine,
        source=source,
        timings=timings,
        seat=seat,
        frames=asking.frames,
        holds_slot=asking.holds_slot,
        resumable=asking.resumable,
    )
    if identity.classroom is not None:
        class_live_start()  # the teacher's dashboard counts it
    return answer
