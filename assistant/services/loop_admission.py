"""A page's question admitted on the event loop in the production profile, without a trip to a
database thread: its session read from Redis and its try for a stream slot sent by the loop's
own client (``assistant/loop_redis.py``), in its batches, and a continued conversation's history
read by the loop's own PostgreSQL connection (``assistant/loop_postgres.py``).

On a thread (``services/answer_start.py: _page_admitted``) a question costs three round trips:
the session from Redis, the class's row from the database, the script that counts the rate and
takes the slot; a continued conversation two more, its owner checked and its history read. Here
a new conversation costs two, each a command in the loop's next batch: the session, then the
script; a continued one a read in the loop's next PostgreSQL batch between them (its owner and
history in one query). The class is this process's last read of it
(``classrooms.class_guess``), good only when its version is still the one Redis holds, which the
script checks before it counts anything (``services/class_versions.py``).

Only what needs nothing else is admitted here: an anonymous session found in the cache, of no
class or of a class read here before that is open and the one the page showed, asking in a new
conversation or continuing one of its own (not replacing a question: that one's checks stay on
the thread). Anything else (a logged-in user, a session the cache has not got, a class not read
here or changed since, a paused class, a page that showed another, a conversation that is not
theirs) is admitted on a thread as before, which reads what it needs and answers with the same
refusals; so is everything where the loop has no client (Daphne, the local profile) or Redis or
PostgreSQL failed to answer.
"""

import uuid
from collections.abc import Coroutine, Sequence
from typing import Any

from django.conf import settings

from assistant.engines import ChatMessage
from assistant.errors import Rejected
from assistant.loop_postgres import loop_reads
from assistant.services.admission import chat_admit_on_loop
from assistant.services.answer_open import Admitted
from assistant.services.chat_request import ClassShown
from assistant.services.class_versions import class_version
from assistant.services.classrooms import ClassContext, chat_rate_for, class_shown_check
from assistant.services.conversations import history_on_loop
from assistant.services.identity import Identity, identity_on_loop
from assistant.services.stream_slots import RedisSlots, slot_store
from assistant.services.table_rows import Row


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
    reading = identity_on_loop(session_key)
    if reading is None:
        return None
    return _admitted(reading, store, conversation_id, shown, request_id, held)


async def _admitted(
    reading: Coroutine[Any, Any, Identity | None],
    store: RedisSlots,
    conversation_id: uuid.UUID | None,
    shown: ClassShown,
    request_id: str,
    held: Sequence[Row],
) -> Admitted | None:
    identity = await reading
    if identity is None:
        return None
    classroom = identity.classroom
    if classroom is not None and (classroom.paused or not _shown(shown, classroom)):
        return None  # the thread reads it again, and refuses if it still must
    history: list[ChatMessage] = []
    if conversation_id is not None:
        found = await _history(identity, conversation_id, held)
        if found is None:
            return None  # the thread reads it, and refuses a conversation not theirs
        history = found
    tried = await chat_admit_on_loop(
        store,
        owner_key=identity.owner_key,
        request_id=request_id,
        rate=chat_rate_for(classroom),
        class_version=class_version(classroom, check=True),
    )
    return None if tried is None else (identity, tried, history)


async def _history(
    identity: Identity, conversation_id: uuid.UUID, held: Sequence[Row]
) -> list[ChatMessage] | None:
    reading = history_on_loop(
        owner_key=identity.owner_key,
        classroom_id=identity.classroom_id,
        conversation_id=conversation_id,
        limit=settings.CHATSITE_STREAM["HISTORY_MESSAGES"],
        held=held,
    )
    return None if reading is None else await reading


def _shown(shown: ClassShown, classroom: ClassContext) -> bool:
    try:
        class_shown_check(shown, classroom)
    except Rejected:
        return False
    return True
