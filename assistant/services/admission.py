"""Per-student limits, checked in the same trip to a database thread as the session lookup, so
they add no wait before the first token: a rate limit, and a cap on answers streaming at once.

The rate's count lives in Django's cache, the slots in ``services/stream_slots`` (Redis in the
production profile, so every worker counts together); a question's count and its first try for
a slot are one step of the slot store, one round trip to Redis whatever the cap.
Synchronous: call through ``assistant.db.run_db``.
"""

import asyncio
import logging
from collections.abc import Callable

from django.conf import settings

from assistant import conf, errors
from assistant.cache import in_process_cache
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.services.answer_registry import answer_preempt
from assistant.services.ratelimit import rate_window
from assistant.services.stream_slots import (
    STALE_CLASS,
    ClassVersion,
    RateCount,
    RedisSlots,
    SlotAsk,
    SlotTry,
    slot_store,
    slots_in_process,
)

logger = logging.getLogger(__name__)

#: Seconds after which a stream slot frees itself even if its release was lost (a worker died).
SLOT_TTL_S = 120
#: What the page is told to wait when all of a student's slots are taken.
SLOT_RETRY_AFTER_S = 5
#: How long a request waits for a slot being given back before it is refused.
SLOT_WAIT_S = 1.0


def chat_admit(
    *,
    owner_key: str,
    request_id: str,
    rate: int | None = None,
    class_version: ClassVersion | None = None,
) -> SlotTry:
    """Count this chat request against the owner's rate (``rate`` per window, else the site's;
    ``Rejected``, 429 with Retry-After, when over it) and try to take a stream slot (when all
    are taken: ``chat_slot_wait``), in one step of the slot store (one round trip to Redis).
    ``class_version``: the asker's class as just read, kept for the event loop's admissions."""
    ask, resets_in_s = slot_ask(owner_key, rate, class_version)
    return within_rate(slot_store().take(owner_key, request_id, **ask), resets_in_s)


async def chat_admit_on_loop(
    store: RedisSlots,
    *,
    owner_key: str,
    request_id: str,
    rate: int | None,
    class_version: ClassVersion | None,
) -> SlotTry | None:
    """``chat_admit`` from the event loop, by its own client (``RedisSlots.take_on_loop``),
    with the class version this process holds to check; None, having counted nothing, where
    it is not Redis's or the loop could not ask: ``chat_admit`` on a thread then."""
    ask, resets_in_s = slot_ask(owner_key, rate, class_version)
    tried = await store.take_on_loop(owner_key, request_id, **ask)
    if tried is None or tried is STALE_CLASS:
        return None
    return within_rate(tried, resets_in_s)


def slot_ask(
    owner_key: str, rate: int | None, class_version: ClassVersion | None
) -> tuple[SlotAsk, int]:
    """What a chat request's try for a slot asks of the store (its count against its owner's
    rate among it), and the seconds until the rate's window resets."""
    limit, window_s = conf.settings.CHATSITE_RATE_LIMITS["chat"]
    if rate is not None:
        limit = rate
    window = rate_window(scope="chat", key=owner_key, window_s=window_s)
    ask = SlotAsk(
        limit=conf.settings.CHATSITE_STREAM["STREAMS_PER_SESSION"],
        ttl_s=SLOT_TTL_S,
        rate=RateCount(key=window.key, limit=limit, ttl_s=window.ttl_s),
        class_version=class_version,
    )
    return ask, window.resets_in_s


def within_rate(tried: SlotTry, resets_in_s: int) -> SlotTry:
    if tried.over_rate:
        raise Rejected(errors.RATE_LIMITED, retry_after=resets_in_s)
    return tried


async def chat_slot_wait(*, owner_key: str, request_id: str, tried: SlotTry) -> None:
    """A slot for a request whose first try (``tried``) found them all taken: one held by an
    answer whose page went away is taken over; else wait up to ``SLOT_WAIT_S`` (an answer that
    has just ended may still be giving its slot back), then refuse: 429 ``stream_active``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SLOT_WAIT_S
    while not await _slot_take_over(owner_key=owner_key, request_id=request_id, tried=tried):
        if loop.time() >= deadline:
            raise Rejected(errors.STREAM_ACTIVE, retry_after=SLOT_RETRY_AFTER_S)
        await asyncio.sleep(0.05)
        tried = await run_db(chat_slot_take, owner_key=owner_key, request_id=request_id)
        if tried.taken:
            return


async def _slot_take_over(*, owner_key: str, request_id: str, tried: SlotTry) -> bool:
    """Take the slot of an answer of this owner's that nobody listens to any more (it was kept
    going for a resume; the student asked something new instead), stopping that answer."""
    for holder in tried.holders:
        if answer_preempt(owner_key=owner_key, request_id=holder):
            store = slot_store()
            return await _slot_call(
                store.hand_over, owner_key, holder, request_id, ttl_s=SLOT_TTL_S
            )
    return False


def chat_slot_take(*, owner_key: str, request_id: str) -> SlotTry:
    """Take one of the owner's stream slots (taken too when there is no cap)."""
    limit = settings.CHATSITE_STREAM["STREAMS_PER_SESSION"]
    if not limit:
        return SlotTry(taken=True)
    store = slot_store()
    return store.take(owner_key, request_id, limit=limit, ttl_s=SLOT_TTL_S)


def cache_in_process() -> bool:
    """The cache is this process's memory: calls cost microseconds and need no thread
    (``assistant.cache.in_process_cache``)."""
    return in_process_cache() is not None


def chat_release(*, owner_key: str, request_id: str) -> None:
    """Give back the slot ``request_id`` holds, if any."""
    if settings.CHATSITE_STREAM["STREAMS_PER_SESSION"]:
        slot_store().release(owner_key, request_id)


async def _slot_call[**P, R](function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """``function`` (a slot step) from the event loop: in place when the slots are this
    process's memory, else on a database thread (a round trip to Redis)."""
    if slots_in_process():
        return function(*args, **kwargs)
    return await run_db(function, *args, **kwargs)


async def chat_slot_release(*, owner_key: str, request_id: str) -> None:
    """``chat_release`` from the event loop: in place when the slots are this process's memory,
    by the loop's own Redis client where the server gave it one, else on a database thread. A
    failure is logged: the slot frees itself after ``SLOT_TTL_S``."""
    if not conf.settings.CHATSITE_STREAM["STREAMS_PER_SESSION"]:
        return  # no slots to give back: no trip to a thread
    try:
        if not await slot_store().release_on_loop(owner_key, request_id):
            await run_db(chat_release, owner_key=owner_key, request_id=request_id)
    except Exception:
        logger.exception("Could not give back the stream slot of %s", request_id)
