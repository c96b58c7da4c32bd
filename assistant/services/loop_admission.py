"""A new question admitted on the event loop in the production profile, without a trip to a
database thread: its session read from Redis and its try for a stream slot sent by the loop's
own client (``assistant/loop_redis.py``), in its batches.

On a thread (``services/answer_start.py: _page_admitted``) a question costs three round trips:
the session from Redis, the class's row from the database, the script that counts the rate and
takes the slot. Here it costs two, each a command in the loop's next batch: the session, then the
script. The class is this process's last read of it (``classrooms.class_guess``), good only when
its version is still the one Redis holds, which the script checks before it counts anything
(``services/class_versions.py``).

Only what needs nothing else is admitted here: a new conversation (a continued one reads its
history from the database), an anonymous session found in the cache, of no class or of a class
read here before that is open and the one the page showed. Anything else (a logged-in user, a
session the cache has not got, a class not read here or changed since, a paused class, a page
that showed another) is admitted on a thread as before, which reads what it needs and answers
with the same refusals; so is everything where the loop has no client (Daphne, the local
profile) or Redis failed to answer.
"""

import uuid
from collections.abc import Coroutine
from typing import Any

from assistant.errors import Rejected
from assistant.services.admission import chat_admit_on_loop
from assistant.services.answer_open import Admitted
from assistant.services.chat_request import ClassShown
from assistant.services.class_versions import class_version
from assistant.services.classrooms import ClassContext, chat_rate_for, class_shown_check
from assistant.services.identity import Identity, identity_on_loop
from assistant.services.stream_slots import RedisSlots, slot_store


def page_admission_on_loop(
    session_key: str, conversation_id: uuid.UUID | None, shown: ClassShown, request_id: str
) -> Coroutine[Any, Any, Admitted | None] | None:
    """The admission of a page's question on the event loop, if it can be tried there (else
    None: on a thread). The coroutine's None: it could not be told there, nothing was taken."""
    if conversation_id is not None:
        return None  # a continued conversation's history is in the database
    store = slot_store()
    if not isinstance(store, RedisSlots):
        return None
    reading = identity_on_loop(session_key)
    if reading is None:
        return None
    return _admitted(reading, store, shown, request_id)


async def _admitted(
    reading: Coroutine[Any, Any, Identity | None],
    store: RedisSlots,
    shown: ClassShown,
    request_id: str,
) -> Admitted | None:
    identity = await reading
    if identity is None:
        return None
    classroom = identity.classroom
    if classroom is not None and (classroom.paused or not _shown(shown, classroom)):
        return None  # the thread reads it again, and refuses if it still must
    tried = await chat_admit_on_loop(
        store,
        owner_key=identity.owner_key,
        request_id=request_id,
        rate=chat_rate_for(classroom),
        class_version=class_version(classroom, check=True),
    )
    return None if tried is None else (identity, tried, [])


def _shown(shown: ClassShown, classroom: ClassContext) -> bool:
    try:
        class_shown_check(shown, classroom)
    except Rejected:
        return False
    return True
