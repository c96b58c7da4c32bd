"""A page's question admitted on the event loop in the production profile, without a trip to a
database thread: its session read from Redis and its try for a stream slot sent by the loop's
own client (``assistant/loop_redis.py``), in its batches, and a continued conversation's history
read by the loop's own PostgreSQL connection (``assistant/loop_postgres.py``).

On a thread (``services/answer_start.py: _page_admitted``) a question costs three round trips:
the session from Redis, the class's row from the database, the script that counts the rate and
takes the slot; a continued conversation two more, its owner checked and its history read. Here
a new conversation costs one where the page said what it showed of the class (``_Guess``): the
script that counts and takes, made for the only asker admitted here, the anonymous owner the
session key names, in the class the page showed, reads the session too
(``slot_scripts.TAKE_SEEN``), and is undone (``GIVE_BACK``) where the session names someone
else. Where the page did not say, or showed a class not read here, it costs two: the session,
then the script. A continued one costs a read in the loop's next PostgreSQL batch as well (its
owner and history in one query), sent beside the session's read where the page said what it
showed (``_Beside``, for the same asker; used once the session says so), else after it. The
class is this process's last read of it (``classrooms.class_guess``), good only when its version
is still the one Redis holds, which the script checks before it counts anything
(``services/class_versions.py``).

Only what needs nothing else is admitted here: an anonymous session found in the cache, of no
class or of a class read here before that is open and the one the page showed, asking in a new
conversation or continuing one of its own (not replacing a question: that one's checks stay on
the thread). Anything else (a logged-in user, a session the cache has not got, a class not read
here or changed since, a paused class, a page that showed another, a conversation that is not
theirs) is admitted on a thread as before, which reads what it needs and answers with the same
refusals; so is everything where the loop has no client (Daphne, the local profile) or Redis or
PostgreSQL failed to answer.
"""

import logging
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from assistant import conf
from assistant.engines import ChatMessage
from assistant.errors import Rejected
from assistant.loop_postgres import loop_reads
from assistant.services.admission import chat_admit_on_loop, slot_ask, within_rate
from assistant.services.answer_open import Admitted
from assistant.services.chat_request import ClassShown
from assistant.services.class_versions import class_version
from assistant.services.classrooms import (
    ClassContext,
    chat_rate_for,
    class_guess,
    class_shown_check,
)
from assistant.services.conversations import history_on_loop
from assistant.services.identity import (
    Identity,
    SessionOnLoop,
    identity_read,
    identity_stored,
    owner_key_for,
    session_on_loop,
)
from assistant.services.stream_slots import STALE_CLASS, RateCount, RedisSlots, SeenTry, slot_store
from assistant.services.table_rows import Row

logger = logging.getLogger(__name__)


def page_admission_on_loop(
    session_key: str,
    conversation_id: uuid.UUID | None,
    replaces: uuid.UUID | None,
    shown: ClassShown,
    request_id: str,
    *,
    held: Sequence[Row] = (),
) -> Coroutine[Any, Any, Admitted | None] | None:
    """The admission of a page's question on the event loop, if it can be tried there (else
    None: on a thread). The coroutine's None: it could not be told there, nothing was taken.
    A continued conversation's history is completed with ``held``
    (``conversations.history_held``)."""
    if replaces is not None:
        return None  # the replaced question's checks are the thread's
    if conversation_id is not None and loop_reads() is None:
        return None  # a continued conversation's history is read on a thread
    store = slot_store()
    if not isinstance(store, RedisSlots):
        return None
    session = session_on_loop(session_key)
    if session is None:
        return None
    guess = _guess(store, session, shown, request_id)
    beside: _Beside | None = None
    if conversation_id is not None and shown is not None:
        # Its history read beside the session, for whom the session will name if the loop is
        # to admit them: an anonymous session (its owner is its key's), of the class its page
        # showed (checked below: the read's answer is used only for them).
        owner_key = owner_key_for(None, session_key)
        sent = _history(owner_key, shown[0], conversation_id, held)
        beside = None if sent is None else _Beside(owner_key, shown[0], sent)
    if guess is not None:
        return _admitted_as_guessed(guess, store, session, conversation_id, held, beside)
    reading = identity_read(session)
    return _admitted(reading, store, conversation_id, shown, request_id, held, beside)


@dataclass(frozen=True, slots=True)
class _Beside:
    """A history read sent beside the session's, and for whom."""

    owner_key: str
    classroom_id: uuid.UUID | None
    reading: Coroutine[Any, Any, list[ChatMessage] | None]

    def for_(self, identity: Identity) -> bool:
        return (identity.owner_key, identity.classroom_id) == (self.owner_key, self.classroom_id)


@dataclass(frozen=True, slots=True)
class _Guess:
    """A try for a slot sent with the session's read (``RedisSlots.take_seen_on_loop``), for the
    asker the page's question names if the session bears it out: the anonymous owner of its
    key, in the class the page showed."""

    owner_key: str
    classroom: ClassContext | None
    request_id: str
    rate: RateCount
    resets_in_s: int
    sent: Coroutine[Any, Any, SeenTry | None]


def _guess(
    store: RedisSlots, session: SessionOnLoop, shown: ClassShown, request_id: str
) -> _Guess | None:
    """The try for the asker the page names, where it can be made with the session's read: the
    page said what it showed, that class (or none) was read here, is open and is as shown, and
    the session is in the slots' Redis. None: the session is read first."""
    if shown is None or session.url != store.url:
        return None
    known, classroom = class_guess(None if shown[0] is None else str(shown[0]))
    if not known or (classroom is not None and classroom.paused) or not _shown(shown, classroom):
        return None
    owner_key = owner_key_for(None, session.session_key)
    ask, resets_in_s = slot_ask(
        owner_key, chat_rate_for(classroom), class_version(classroom, check=True)
    )
    sent = store.take_seen_on_loop(session.key, owner_key, request_id, **ask)
    return _Guess(owner_key, classroom, request_id, ask["rate"], resets_in_s, sent)


async def _admitted_as_guessed(
    guess: _Guess,
    store: RedisSlots,
    session: SessionOnLoop,
    conversation_id: uuid.UUID | None,
    held: Sequence[Row],
    beside: _Beside | None,
) -> Admitted | None:
    """The guessed asker admitted, if the session names them; else their try undone (the
    thread admits whoever it is)."""
    counted = False
    try:
        seen = await guess.sent
        if seen is None or seen.tried is None or seen.tried is STALE_CLASS:
            return None  # nothing counted (or Redis failed): the thread's
        counted = True
        identity = identity_stored(session, seen.session)
        if identity is None or (identity.owner_key, identity.classroom_id) != (
            guess.owner_key,
            None if guess.classroom is None else guess.classroom.id,
        ):
            return None
        identity = Identity(guess.owner_key, guess.classroom)  # as the script checked it
        history = await _history_for(identity, conversation_id, held, beside)
        if history is None:
            return None  # the thread reads it, and refuses a conversation not theirs
        counted = False  # theirs: over the rate, the count stands as on the thread
        return identity, within_rate(seen.tried, guess.resets_in_s), history
    finally:
        if beside is not None:
            beside.reading.close()  # unused: dropped (used: already done)
        if counted:
            await _given_back(store, guess)


async def _given_back(store: RedisSlots, guess: _Guess) -> None:
    try:
        await store.give_back_on_loop(guess.owner_key, guess.request_id, guess.rate)
    except Exception:
        # The slot frees itself after its time to live, the count with its window.
        logger.exception("Could not undo the try for a slot of %s", guess.request_id)


async def _admitted(
    reading: Coroutine[Any, Any, Identity | None],
    store: RedisSlots,
    conversation_id: uuid.UUID | None,
    shown: ClassShown,
    request_id: str,
    held: Sequence[Row],
    beside: _Beside | None,
) -> Admitted | None:
    try:
        identity = await reading
        if identity is None:
            return None
        classroom = identity.classroom
        if (classroom is not None and classroom.paused) or not _shown(shown, classroom):
            return None  # the thread reads it again, and refuses if it still must
        history = await _history_for(identity, conversation_id, held, beside)
        if history is None:
            return None  # the thread reads it, and refuses a conversation not theirs
    finally:
        if beside is not None:
            beside.reading.close()  # unused: dropped (used: already done)
    tried = await chat_admit_on_loop(
        store,
        owner_key=identity.owner_key,
        request_id=request_id,
        rate=chat_rate_for(classroom),
        class_version=class_version(classroom, check=True),
    )
    return None if tried is None else (identity, tried, history)


async def _history_for(
    identity: Identity,
    conversation_id: uuid.UUID | None,
    held: Sequence[Row],
    beside: _Beside | None,
) -> list[ChatMessage] | None:
    """The asker's history of a continued conversation (none for a new one): the read sent
    beside the session's where it was for them, else one sent now; None where the loop could
    not tell (not theirs, or the read failed)."""
    if conversation_id is None:
        return []
    if beside is not None and beside.for_(identity):
        asked = beside.reading
    else:
        asked = _history(identity.owner_key, identity.classroom_id, conversation_id, held)
    return None if asked is None else await asked


def _history(
    owner_key: str,
    classroom_id: uuid.UUID | None,
    conversation_id: uuid.UUID,
    held: Sequence[Row],
) -> Coroutine[Any, Any, list[ChatMessage] | None] | None:
    """``history_on_loop`` for the page's settings: the read is sent now."""
    return history_on_loop(
        owner_key=owner_key,
        classroom_id=classroom_id,
        conversation_id=conversation_id,
        limit=conf.settings.CHATSITE_STREAM["HISTORY_MESSAGES"],
        held=held,
    )


def _shown(shown: ClassShown, classroom: ClassContext | None) -> bool:
    try:
        class_shown_check(shown, classroom)
    except Rejected:
        return False
    return True
