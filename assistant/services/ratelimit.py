"""Fixed-window rate limits in Django's cache (local memory here, Redis in production, so all
workers share the counts). Synchronous: call through ``run_db`` from async code."""

import math
import time
from dataclasses import dataclass

from django.core.cache import cache

from assistant.cache import in_process_cache


@dataclass(frozen=True, slots=True)
class Window:
    """The fixed window a request falls in: its count's key in the cache, how long that count
    lives from its first request, and the seconds until the next window starts."""

    key: str
    ttl_s: float
    resets_in_s: int


def rate_window(*, scope: str, key: str, window_s: int) -> Window:
    """The window ``key``'s request counts in now, for ``scope``'s limit of ``window_s``."""
    now = time.time()
    bucket = int(now // window_s)
    return Window(
        key=f"ratelimit:{scope}:{key}:{bucket}",
        ttl_s=window_s + 1,
        resets_in_s=max(1, math.ceil((bucket + 1) * window_s - now)),
    )


def counter_hit(cache_key: str, *, timeout: float) -> int:
    """Add one to the count at ``cache_key`` (which lives ``timeout`` seconds from its first
    hit) and return it, counted once whichever worker asks: in one round trip on the production
    profile's cache (``assistant.cache.SharedRedisCache.count_hit``), in this process's memory
    on the local profile's (``assistant.cache.in_process_cache``)."""
    counts = in_process_cache() or cache
    count_hit = getattr(counts, "count_hit", None)
    if count_hit is not None:
        return count_hit(cache_key, timeout=timeout)
    counts.add(cache_key, 0, timeout=timeout)
    try:
        return counts.incr(cache_key)
    except ValueError:  # expired between add and incr
        counts.set(cache_key, 1, timeout=timeout)
        return 1


def rate_limit_hit(*, scope: str, key: str, limit: int, window_s: int) -> int | None:
    """Count one request; when over ``limit`` in this window, the seconds until it resets."""
    window = rate_window(scope=scope, key=key, window_s=window_s)
    if counter_hit(window.key, timeout=window.ttl_s) <= limit:
        return None
    return window.resets_in_s


def rate_limit_forgive(*, scope: str, key: str, window_s: int) -> None:
    """Give back one request counted by ``rate_limit_hit`` in this window: for limits that
    count only failures, counted first (so that requests at once cannot all slip under the
    limit) and forgiven when they succeed."""
    try:
        cache.decr(rate_window(scope=scope, key=key, window_s=window_s).key)
    except ValueError:  # the window turned meanwhile: nothing to give back
        pass
