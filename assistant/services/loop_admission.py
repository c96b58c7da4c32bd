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

import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache, RedisSerializer
from django.core.signals import setting_changed

from assistant.engines import ChatMessage
from assistant.errors import Rejected
from assistant.loop_redis import LoopCommands, loop_redis_commands
from assistant.services.admission import chat_admit_on_loop
from assistant.services.chat_request import ClassShown
from assistant.services.class_versions import class_version
from assistant.services.classrooms import (
    SESSION_CLASS,
    ClassContext,
    chat_rate_for,
    class_guess,
    class_shown_check,
)
from assistant.services.identity import Identity, owner_key_for
from assistant.services.stream_slots import RedisSlots, SlotTry, slot_store

Admitted = tuple[Identity, SlotTry, list[ChatMessage]]


@dataclass(frozen=True, slots=True)
class _Sessions:
    """Where the session store keeps its sessions in Redis: the cache's URL, the Redis key of a
    session key, and how a session's value is read."""

    url: str
    prefix: str
    make_key: Callable[[str], str]
    loads: Callable[[bytes], Any]


def page_admission_on_loop(
    session_key: str, conversation_id: object, shown: ClassShown, request_id: str
) -> Coroutine[Any, Any, Admitted | None] | None:
    """The admission of a page's question on the event loop, if it can be tried there (else
    None: on a thread). The coroutine's None: it could not be told there, nothing was taken."""
    if conversation_id is not None or len(session_key) < 8:
        return None  # a continued conversation's history; the store's check of a key
    store = slot_store()
    sessions = _sessions_in_redis()
    if not isinstance(store, RedisSlots) or sessions is None:
        return None
    commands = loop_redis_commands(sessions.url)
    if commands is None:
        return None
    return _admitted(commands, store, sessions, session_key, shown, request_id)


async def _admitted(
    commands: LoopCommands,
    store: RedisSlots,
    sessions: _Sessions,
    session_key: str,
    shown: ClassShown,
    request_id: str,
) -> Admitted | None:
    try:
        raw = await commands.send("GET", sessions.make_key(sessions.prefix + session_key))
        data = None if raw is None else sessions.loads(raw)
    except Exception:
        return None  # the thread's read answers (or fails) as it always has
    if not isinstance(data, dict) or SESSION_KEY in data:
        return None  # no session in the cache, or a user (whose auth hash is checked there)
    classroom: ClassContext | None = None
    class_id = data.get(SESSION_CLASS)
    if class_id:
        _, classroom = class_guess(str(class_id))
        if classroom is None or classroom.paused or not _shown(shown, classroom):
            return None
    identity = Identity(owner_key=owner_key_for(None, session_key), classroom=classroom)
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


@functools.cache
def _sessions_in_redis() -> _Sessions | None:
    """Where the session store keeps its sessions, if in a cache that is one Redis (Django's
    ``cached_db`` or ``cache`` on its Redis cache); None otherwise. Worked out once until the
    settings change."""
    prefix = getattr(import_module(settings.SESSION_ENGINE).SessionStore, "cache_key_prefix", None)
    alias = settings.SESSION_CACHE_ALIAS
    cache = caches[alias]
    location = settings.CACHES[alias].get("LOCATION")
    if prefix is None or not isinstance(cache, RedisCache) or not isinstance(location, str):
        return None
    if "," in location:
        return None  # a writer and replicas: which one a read goes to is the cache's choice
    return _Sessions(
        url=location, prefix=prefix, make_key=cache.make_key, loads=RedisSerializer().loads
    )


def _forget_sessions(*, setting: str, **kwargs: object) -> None:
    if setting in ("SESSION_ENGINE", "SESSION_CACHE_ALIAS", "CACHES"):
        _sessions_in_redis.cache_clear()


setting_changed.connect(_forget_sessions)
