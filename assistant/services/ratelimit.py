"""Fixed-window rate limits in Django's cache (local memory here, Redis in production, so all
workers share the counts). Synchronous: call through ``run_db`` from async code."""

import math
import time

from django.core.cache import cache


def counter_hit(cache_key: str, *, timeout: float) -> int:
    """Add one to the count at ``cache_key`` (which lives ``timeout`` seconds from its first
    hit) and return it, counted once whichever worker asks."""
    cache.add(cache_key, 0, timeout=timeout)
    try:
        return cache.incr(cache_key)
    except ValueError:  # expired between add and incr
        cache.set(cache_key, 1, timeout=timeout)
        return 1


def rate_limit_hit(*, scope: str, key: str, limit: int, window_s: int) -> int | None:
    """Count one request; when over ``limit`` in this window, the seconds until it resets."""
    now = time.time()
    bucket = int(now // window_s)
    count = counter_hit(f"ratelimit:{scope}:{key}:{bucket}", timeout=window_s + 1)
    if count <= limit:
        return None
    return _until_reset(now, bucket, window_s)


def rate_limit_forgive(*, scope: str, key: str, window_s: int) -> None:
    """Give back one request counted by ``rate_limit_hit`` in this window: for limits that
    count only failures, counted first (so that requests at once cannot all slip under the
    limit) and forgiven when they succeed."""
    bucket = int(time.time() // window_s)
    try:
        cache.decr(f"ratelimit:{scope}:{key}:{bucket}")
    except ValueError:  # the window turned meanwhile: nothing to give back
        pass


def _until_reset(now: float, bucket: int, window_s: int) -> int:
    return max(1, math.ceil((bucket + 1) * window_s - now))
