"""Who is asking: the owner key that scopes conversations, resolved from the session cookie.

Views get ``request.user`` and ``request.session`` from Django's middleware; the streaming
consumer runs without that stack and resolves the same identity here, with Django's own session
store and ``get_user`` (which checks the session's auth hash), in one trip to a worker thread.
Where the sessions' cache is this process's memory, an anonymous session found in it, and of no
class, is known on the event loop without that trip (``identity_in_memory``); where it is Redis
and the event loop has a client of its own, an anonymous session found in it is read by that
client (``session_on_loop``, ``identity_read``, ``identity_stored``).

Sessions are issued by the page (``session_issue``), a limited number per client address and
minute. Nothing else creates one: a stream without a live session is refused
(``session_required``), so a client cannot shed its limits by dropping its cookie.

An anonymous owner is named by a keyed hash of its session key (``session_pseudonym``), never
the key itself: owner keys are stored, listed in the admin and searched, and a session key
would work as the student's cookie for whoever read it.
"""

import functools
import hashlib
import hmac
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache, RedisSerializer
from django.core.signals import setting_changed

from assistant import errors
from assistant.cache import in_process_cache
from assistant.errors import Rejected
from assistant.loop_redis import LoopCommands, loop_redis_commands
from assistant.services.classrooms import SESSION_CLASS, ClassContext, class_guess, session_class
from assistant.services.ratelimit import rate_limit_hit


@dataclass(frozen=True, slots=True)
class Identity:
    #: "" when the request has no live session (and no logged-in user).
    owner_key: str
    #: The class the session belongs to, read with it; None: none.
    classroom: ClassContext | None = None

    @property
    def classroom_id(self) -> uuid.UUID | None:
        return None if self.classroom is None else self.classroom.id


#: Keeps the owner-key hash apart from every other use of SECRET_KEY. Changing it, or the
#: secret key, orphans anonymous students' conversations (their sessions end with the key too).
OWNER_SALT = "chatsite.identity.owner-key"


def session_pseudonym(session_key: str) -> str:
    """A name for a session that cannot be used as one: HMAC-SHA256 of its key under the
    site's secret key, 64 hex digits (Django's ``salted_hmac(OWNER_SALT, session_key,
    algorithm="sha256")``, with its key worked out once per secret key)."""
    return _pseudonym(settings.SECRET_KEY, session_key)


@functools.lru_cache(maxsize=4096)
def _pseudonym(secret: str, session_key: str) -> str:
    """``session_pseudonym``, remembered for the sessions asking now: a student asks many
    questions, and the HMAC took 13-30 µs a call in a busy worker (cProfile), 2 µs timed in a
    loop."""
    return hmac.digest(_owner_hmac_key(secret), session_key.encode(), "sha256").hex()


@functools.lru_cache(maxsize=4)
def _owner_hmac_key(secret: str) -> bytes:
    """``salted_hmac``'s key for ``OWNER_SALT`` under ``secret``: SHA-256 of the two."""
    return hashlib.sha256((OWNER_SALT + secret).encode()).digest()


def owner_key_for(user: Any, session_key: str | None) -> str:
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    if not session_key:
        raise ValueError("An anonymous owner needs a session")
    return f"session:{session_pseudonym(session_key)}"


def session_live(session: Any) -> bool:
    """``session`` exists in the store (an unknown or expired cookie's does not)."""
    session.get("created")  # loads it: an unknown key is dropped on the way
    return session.session_key is not None


def session_issue(session: Any, *, client: str) -> bool:
    """Give ``session`` a key (saving it) if it has none, counted against ``client``'s new
    sessions this minute; True when it was created now. Synchronous (cache and database).

    Raises ``Rejected`` (429 ``new_sessions_limited``) when the address has started too many.
    """
    if session_live(session):
        return False
    limit = settings.CHATSITE_CLIENTS["NEW_SESSIONS_PER_MINUTE"]
    if limit:
        retry_after = rate_limit_hit(scope="session", key=client, limit=limit, window_s=60)
        if retry_after is not None:
            raise Rejected(errors.NEW_SESSIONS_LIMITED, retry_after=retry_after)
    session["created"] = True
    session.save()
    return True


def session_user(session_key: str | None) -> tuple[Any, Any]:
    """Synchronous (session store, ORM): the user behind a session cookie (anonymous when
    nobody is logged in, or the session is no longer valid for them), and the session. An
    unknown or expired key leaves the session empty and without a key."""
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(_SessionOnly(session)), session  # type: ignore[arg-type]


class _SessionOnly:
    """What ``get_user`` reads of a request, its session, without the rest of an
    ``HttpRequest`` (whose query dicts and headers cost 14 µs to make for nothing)."""

    __slots__ = ("session",)

    def __init__(self, session: Any) -> None:
        self.session = session


def identity_resolve(session_key: str | None) -> Identity:
    """Synchronous (ORM): the identity behind a session cookie; the empty owner key when the
    request has no live session."""
    user, session = session_user(session_key)
    if not user.is_authenticated and not session.session_key:
        return Identity(owner_key="")
    return Identity(
        owner_key=owner_key_for(user, session.session_key), classroom=session_class(session)
    )


def identity_in_memory(session_key: str) -> Identity | None:
    """``identity_resolve``'s answer where it needs no I/O, so no trip to a thread: the session
    store keeps its sessions in a cache (Django's ``cached_db`` or ``cache``) that is this
    process's memory, the session is in it, nobody is logged in on it and it names no class.
    None otherwise (a user or a class is read from the database, a session missing from the
    cache is looked for there): ask ``identity_resolve`` on a database thread."""
    found = _sessions_in_memory()
    # The store's own check of a key (``SessionBase._validate_session_key``): an invalid one is
    # no session, which the thread's answer says.
    if found is None or len(session_key) < 8:
        return None
    prefix, sessions = found
    data = sessions.get(prefix + session_key)
    if data is None or SESSION_KEY in data or data.get(SESSION_CLASS):
        return None
    return Identity(owner_key=owner_key_for(None, session_key))


@functools.cache
def _sessions_in_memory() -> tuple[str, LocMemCache] | None:
    """The session store's cache key prefix and its cache, where it keeps its sessions in a
    cache that is this process's memory (``assistant.cache.in_process_cache``); None
    otherwise. Worked out once until the settings change."""
    prefix = getattr(import_module(settings.SESSION_ENGINE).SessionStore, "cache_key_prefix", None)
    sessions = in_process_cache(settings.SESSION_CACHE_ALIAS)
    if prefix is None or sessions is None:
        return None
    return prefix, sessions


@dataclass(frozen=True, slots=True)
class SessionOnLoop:
    """A session the event loop's own client may read: the client, the Redis it is in, its key
    there, and what its stored value says of its asker (``identity_stored``)."""

    commands: LoopCommands
    url: str
    key: str
    session_key: str
    loads: Callable[[bytes], Any]


def session_on_loop(session_key: str) -> SessionOnLoop | None:
    """Where the event loop's own Redis client (``assistant/loop_redis.py``) reads the session
    of ``session_key``; None where it cannot (the sessions are not in one Redis, the running
    loop has no client, an invalid key): ``identity_resolve`` on a thread then."""
    found = _sessions_in_redis()
    if found is None or len(session_key) < 8:
        return None
    commands = loop_redis_commands(found.url)
    if commands is None:
        return None
    key = found.make_key(found.prefix + session_key)
    return SessionOnLoop(commands, found.url, key, session_key, found.loads)


async def identity_read(session: SessionOnLoop) -> Identity | None:
    """``identity_stored`` of the session as the loop's client reads it now."""
    try:
        raw = await session.commands.send("GET", session.key)
    except Exception:
        return None  # the thread's read answers (or fails) as it always has
    return identity_stored(session, raw)


def identity_stored(session: SessionOnLoop, raw: bytes | None) -> Identity | None:
    """``identity_resolve``'s answer from a session's stored value (``raw``; None: not stored),
    where it needs nothing else; None where a thread must tell (a session the cache has not
    got, a logged-in user, a class not read in this process). The class is this process's last
    read of it (``classrooms.class_guess``), which the caller checks is still the stored one
    (``services/class_versions.py``)."""
    try:
        data = None if raw is None else session.loads(raw)
    except Exception:
        return None
    if not isinstance(data, dict) or SESSION_KEY in data:
        return None  # no session in the cache, or a user (whose auth hash is checked there)
    classroom = None
    class_id = data.get(SESSION_CLASS)
    if class_id:
        _, classroom = class_guess(str(class_id))
        if classroom is None:
            return None
    return Identity(owner_key=owner_key_for(None, session.session_key), classroom=classroom)


@dataclass(frozen=True, slots=True)
class _RedisSessions:
    """Where the session store keeps its sessions in Redis: the cache's URL, its key prefix, the
    Redis key of a cache key, and how a session's value is read."""

    url: str
    prefix: str
    make_key: Callable[[str], str]
    loads: Callable[[bytes], Any]


@functools.cache
def _sessions_in_redis() -> _RedisSessions | None:
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
    return _RedisSessions(location, prefix, cache.make_key, RedisSerializer().loads)


def _forget_sessions(*, setting: str, **kwargs: object) -> None:
    if setting in ("SESSION_ENGINE", "SESSION_CACHE_ALIAS", "CACHES"):
        _sessions_in_memory.cache_clear()
        _sessions_in_redis.cache_clear()


setting_changed.connect(_forget_sessions)


def identity_required(session_key: str | None) -> Identity:
    """``identity_resolve``, refusing (403 ``session_required``) a request without a session."""
    identity = identity_resolve(session_key)
    if not identity.owner_key:
        raise Rejected(errors.SESSION_REQUIRED)
    return identity
