"""Fixed-window rate limits in Django's cache (local memory here, Redis in production, so all
workers share the counts). Synchronous: call through ``run_db`` from async code."""

import math
import time

from django.core.cache import cache


def rate_limit_hit(*, scope: str, key: str, limit: int, window_s: int) -> int | None:
    """Count one request; when over ``limit`` in this window, the seconds until it resets."""
    now = time.time()
    bucket = int(now // window_s)
    cache_key = f"ratelimit:{scope}:{key}:{bucket}"
    cache.add(cache_key, 0, timeout=window_s + 1)
    try:
        count = cache.incr(cache_key)
    except ValueError:  # expired between add and incr
        cache.set(cache_key, 1, timeout=window_s + 1)
        count = 1
    if count <= limit:
        return None
    return max(1, math.ceil((bucket + 1) * window_s - now))
