"""How many answers each student streams at once, counted in one round trip whatever the limit.

A student's slots are one set: the request ids holding one, each with the time its slot frees
itself if its release is lost (a worker died). Taking a slot, giving it back and handing it to
another request are each one atomic step on that set, so the cost is the same for a limit of 1
or of 100,000 (one key per student, not one per slot).

A question's first try for a slot also counts it against the student's rate (``RateCount``: a
fixed-window count in Django's cache, ``services/ratelimit.py``), in the same step: one round
trip to Redis admits a question, where the count alone used to take three (Django's ``add``
and ``incr``: ``SET NX``, ``EXISTS``, ``INCRBY``). A question over its rate takes no slot.

Two stores, chosen by the cache the site runs on: Redis (the production profile: every worker
counts together; a sorted set per student and a Lua script for each step) or this process's
memory (one process, as the local profile's cache is). Synchronous: a Redis step is a network
round trip, so async code calls them through ``run_db`` unless ``slots_in_process()``; but
giving a slot back, which every answer does, goes from the event loop where the server gave it
a client of its own (``release_on_loop``, ``assistant/loop_redis.py``), and so does a new
question's try for one (``take_on_loop``, ``services/loop_admission.py``).

Redis keeps each class's version beside the slots (``ClassVersion``,
``services/class_versions.py``): a try for a slot from the event loop checks the class the
worker holds against it before anything is counted; one from a thread keeps the class it read.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, Unpack

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import default_key_func
from django.core.cache.backends.redis import RedisCache

from assistant.loop_redis import loop_redis_commands
from assistant.services import slot_scripts
from assistant.services.ratelimit import counter_hit
from assistant.services.slot_scripts import script_on_loop

#: How many holders a refusal lists (an answer among them may be taken over).
HOLDERS_SHOWN = 16
#: How long Redis keeps a class's version (ms): one not asked about for a day is read again.
CLASS_VERSION_TTL_MS = 24 * 3600 * 1000
#: The version of a deleted class: no version read before the deletion is kept over it.
CLASS_GONE = "gone"


@dataclass(frozen=True, slots=True)
class SlotTry:
    """What a try for a slot found: taken, or the request ids holding the slots, or (with a
    ``RateCount``) that the request is over its rate and took nothing."""

    taken: bool
    holders: tuple[str, ...] = ()
    over_rate: bool = False


@dataclass(frozen=True, slots=True)
class RateCount:
    """A request to count, before its slot is taken, in a fixed window of Django's cache: the
    count's key (as given to the cache), the requests the window allows, and how long the
    count lives from its first request."""

    key: str
    limit: int
    ttl_s: float


@dataclass(frozen=True, slots=True)
class ClassVersion:
    """The version of the asker's class (``services/class_versions.py``) that a try for a slot
    goes with, with a ``RateCount``: ``check``, the one this process holds, which must be the
    one Redis holds (else the try is ``STALE_CLASS``, before anything is counted); else the
    one just read from the database, kept in Redis unless a newer is there already."""

    class_id: str
    version: str
    check: bool


class SlotAsk(TypedDict):
    """What a question's try for a slot from the event loop asks (``RedisSlots.take_on_loop``):
    the owner's slots, their time to live, its count against its rate, its class's version."""

    limit: int
    ttl_s: float
    rate: RateCount
    class_version: ClassVersion | None


#: What a try over its rate found.
OVER_RATE = SlotTry(taken=False, over_rate=True)
#: What a try found whose ``ClassVersion`` to check is not Redis's: nothing counted or taken.
STALE_CLASS = SlotTry(taken=False)


@dataclass(frozen=True, slots=True)
class SeenTry:
    """A try for a slot made with the read of the asker's session, in one script
    (``RedisSlots.take_seen_on_loop``): the session's stored value, and what the try found;
    both None when the session is not stored (nothing was tried)."""

    session: bytes | None
    tried: SlotTry | None


class SlotStore(Protocol):
    def take(
        self,
        owner_key: str,
        request_id: str,
        *,
        limit: int,
        ttl_s: float,
        now: float | None = None,
        rate: RateCount | None = None,
        class_version: ClassVersion | None = None,
    ) -> SlotTry:
        """Count ``rate`` (if any; over it: ``OVER_RATE``), then take one of the owner's
        ``limit`` slots (0: no cap, nothing is held). ``class_version`` (with ``rate``) is
        kept or checked where the store is shared (Redis); memory ignores it."""
        ...

    def release(self, owner_key: str, request_id: str) -> None: ...

    async def release_on_loop(self, owner_key: str, request_id: str) -> bool:
        """``release`` from the event loop without a thread, where the store can; False, having
        done nothing, where it cannot (call ``release`` on a thread)."""
        ...

    def hand_over(
        self,
        owner_key: str,
        holder: str,
        request_id: str,
        *,
        ttl_s: float,
        now: float | None = None,
    ) -> bool: ...


class MemorySlots:
    """Slots in this process's memory, for a site of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sets: dict[str, dict[str, float]] = {}

    def _live(self, owner_key: str, now: float) -> dict[str, float]:
        held = self._sets.setdefault(owner_key, {})
        for request_id in [r for r, until in held.items() if until <= now]:
            del held[request_id]
        return held

    def take(
        self,
        owner_key: str,
        request_id: str,
        *,
        limit: int,
        ttl_s: float,
        now: float | None = None,
        rate: RateCount | None = None,
        class_version: ClassVersion | None = None,
    ) -> SlotTry:
        if rate is not None and counter_hit(rate.key, timeout=rate.ttl_s) > rate.limit:
            return OVER_RATE
        if not limit:
            return SlotTry(taken=True)
        now = time.time() if now is None else now
        with self._lock:
            held = self._live(owner_key, now)
            if request_id in held or len(held) < limit:
                held[request_id] = now + ttl_s
                return SlotTry(taken=True)
            return SlotTry(taken=False, holders=tuple(held)[:HOLDERS_SHOWN])

    def release(self, owner_key: str, request_id: str) -> None:
        with self._lock:
            held = self._sets.get(owner_key)
            if held is not None:
                held.pop(request_id, None)
                if not held:
                    del self._sets[owner_key]

    async def release_on_loop(self, owner_key: str, request_id: str) -> bool:
        self.release(owner_key, request_id)  # memory: microseconds, in place
        return True

    def hand_over(
        self,
        owner_key: str,
        holder: str,
        request_id: str,
        *,
        ttl_s: float,
        now: float | None = None,
    ) -> bool:
        now = time.time() if now is None else now
        with self._lock:
            held = self._live(owner_key, now)
            if held.pop(holder, None) is None:
                return False
            held[request_id] = now + ttl_s
            return True


def _found(found: list[Any]) -> SlotTry:
    """The take script's reply as a ``SlotTry``."""
    if found[0] == 1:
        return SlotTry(taken=True)
    if found[0] == -1:
        return OVER_RATE
    if found[0] == -2:
        return STALE_CLASS
    return SlotTry(taken=False, holders=tuple(h.decode() for h in found[1]))


def _ms(now: float | None) -> int | str:
    """``now`` for a script: milliseconds, or "" for Redis's own clock."""
    return "" if now is None else int(now * 1000)


class RedisSlots:
    """Slots in Redis, shared by every worker: one sorted set per student, scored by when each
    slot frees itself."""

    def __init__(
        self, url: str, prefix: str, *, count_key: Callable[[str], str] | None = None
    ) -> None:
        """``count_key``: a ``RateCount``'s key as Django's cache stores it (the cache's
        ``make_key``); by default Django's default key function under ``prefix``."""
        import redis

        self._client = redis.Redis.from_url(url)
        self._url = url
        self._prefix = prefix
        self._count_key = count_key or (lambda key: default_key_func(key, prefix, 1))
        self._take = self._client.register_script(slot_scripts.TAKE)
        self._take_seen = self._client.register_script(slot_scripts.TAKE_SEEN)
        self._give_back = self._client.register_script(slot_scripts.GIVE_BACK)
        self._hand_over = self._client.register_script(slot_scripts.HAND_OVER)

    @property
    def url(self) -> str:
        """The Redis the slots are kept in."""
        return self._url

    def _key(self, owner_key: str) -> str:
        return f"{self._prefix}:chat:slots:{owner_key}"

    def take(
        self,
        owner_key: str,
        request_id: str,
        *,
        limit: int,
        ttl_s: float,
        now: float | None = None,
        rate: RateCount | None = None,
        class_version: ClassVersion | None = None,
    ) -> SlotTry:
        keys, args = self._take_call(owner_key, request_id, limit, ttl_s, now, rate, class_version)
        return _found(self._take(keys=keys, args=args))

    async def take_on_loop(
        self, owner_key: str, request_id: str, **ask: Unpack[SlotAsk]
    ) -> SlotTry | None:
        """``take`` by the event loop's own client, in its batch; None where the loop has none,
        or the command failed (the connection, Redis): ``take`` on a thread then, which sees the
        same and answers as it always has."""
        found = await self._take_by_loop(self._take, [], owner_key, request_id, ask)
        return None if found is None else _found(found)

    async def take_seen_on_loop(
        self, session: str, owner_key: str, request_id: str, **ask: Unpack[SlotAsk]
    ) -> SeenTry | None:
        """``take_on_loop`` with the read of the Redis key ``session`` (the asker's session,
        which must be in this Redis), in one script: the try is made only where the session is
        stored. None where the loop has no client or the command failed. A try the session
        does not bear out is undone with ``give_back_on_loop``."""
        found = await self._take_by_loop(self._take_seen, [session], owner_key, request_id, ask)
        if found is None:
            return None
        if found[0] == -3:
            return SeenTry(session=None, tried=None)
        return SeenTry(session=found[0], tried=_found(found[1]))

    async def _take_by_loop(
        self, script: Any, before: list[str], owner_key: str, request_id: str, ask: SlotAsk
    ) -> Any:
        """A take ``script``'s reply by the loop's client, ``before`` its keys; None where the
        loop has no client or the command failed."""
        commands = loop_redis_commands(self._url)
        if commands is None:
            return None
        keys, args = self._take_call(
            owner_key,
            request_id,
            ask["limit"],
            ask["ttl_s"],
            None,
            ask["rate"],
            ask["class_version"],
        )
        try:
            return await script_on_loop(commands, script, [*before, *keys], args)
        except Exception:
            return None

    async def give_back_on_loop(self, owner_key: str, request_id: str, rate: RateCount) -> None:
        """Undo a try the asker's session did not bear out (``take_seen_on_loop``): its slot
        given back, its count taken off. Raises where the loop has no client or Redis failed."""
        commands = loop_redis_commands(self._url)
        if commands is None:
            raise RuntimeError("this loop has no Redis client of its own")
        keys = [self._key(owner_key), self._count_key(rate.key)]
        await script_on_loop(commands, self._give_back, keys, [request_id])

    def _take_call(
        self,
        owner_key: str,
        request_id: str,
        limit: int,
        ttl_s: float,
        now: float | None,
        rate: RateCount | None,
        class_version: ClassVersion | None,
    ) -> tuple[list[str], list[str | int]]:
        keys = [self._key(owner_key)]
        args: list[str | int] = [_ms(now), int(ttl_s * 1000), limit, request_id, HOLDERS_SHOWN]
        if rate is not None:
            keys.append(self._count_key(rate.key))
            args += [rate.limit, int(rate.ttl_s * 1000)]
            if class_version is not None:
                keys.append(self._class_key(class_version.class_id))
                mode = "check" if class_version.check else "keep"
                args += [class_version.version, mode, CLASS_VERSION_TTL_MS]
        return keys, args

    def _class_key(self, class_id: str) -> str:
        return f"{self._prefix}:chat:class:{class_id}:version"

    def class_version_set(self, class_id: str, version: str) -> None:
        """Make ``version`` the class's (a class saved, or ``CLASS_GONE``: deleted)."""
        self._client.set(self._class_key(class_id), version, px=CLASS_VERSION_TTL_MS)

    def release(self, owner_key: str, request_id: str) -> None:
        self._client.zrem(self._key(owner_key), request_id)

    async def release_on_loop(self, owner_key: str, request_id: str) -> bool:
        """``release`` by the event loop's own client (``assistant.loop_redis``), in a batch with
        the other answers' of the moment, where the loop has one."""
        commands = loop_redis_commands(self._url)
        if commands is None:
            return False
        await commands.send("ZREM", self._key(owner_key), request_id)
        return True

    def hand_over(
        self,
        owner_key: str,
        holder: str,
        request_id: str,
        *,
        ttl_s: float,
        now: float | None = None,
    ) -> bool:
        args = [_ms(now), int(ttl_s * 1000), holder, request_id]
        return self._hand_over(keys=[self._key(owner_key)], args=args) == 1


_store: SlotStore | None = None
_store_lock = threading.Lock()


def slot_store() -> SlotStore:
    """Redis when the site's cache is Redis (every worker counts together), else memory; one
    per process, made once even when two threads ask first at the same moment."""
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                _store = _store_made()
    return _store


def _store_made() -> SlotStore:
    cache = caches["default"]
    if isinstance(cache, RedisCache):
        config = settings.CACHES["default"]
        return RedisSlots(
            config["LOCATION"], config.get("KEY_PREFIX", ""), count_key=cache.make_key
        )
    return MemorySlots()


def slots_in_process() -> bool:
    """A slot step costs microseconds and needs no thread."""
    return isinstance(slot_store(), MemorySlots)
