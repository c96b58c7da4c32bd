"""Throttling password logins, per account and per client address, in the shared cache (Redis in
production, so every worker counts together).

Failed logins are counted for the username tried (whether such an account exists or not, so a
lockout tells nothing about who has an account) and for the client's address. When either count
reaches its limit within ``LOCKOUT_S``, that username or that address is locked for ``LOCKOUT_S``
from then on: every attempt is refused, the right password included, with a message that says
when to try again. A successful login clears its username's count. The address limit is the
higher one: a class's teachers may share a school's address.

Synchronous (Django's login views are).
"""

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from assistant.services.ratelimit import counter_hit


@dataclass(frozen=True, slots=True)
class LoginLimits:
    account_failures: int
    address_failures: int
    lockout_s: int


def login_limits() -> LoginLimits:
    config = settings.CHATSITE_LOGIN_LIMITS
    return LoginLimits(
        account_failures=config["FAILURES_PER_ACCOUNT"],
        address_failures=config["FAILURES_PER_ADDRESS"],
        lockout_s=config["LOCKOUT_S"],
    )


def _account(username: str) -> str:
    """The cache key part for a username: case-folded (``Admin`` and ``admin`` count together)
    and hashed (no username in the cache)."""
    digest = hashlib.sha256(username.strip().casefold().encode("utf-8")).hexdigest()[:32]
    return f"account:{digest}"


def _subjects(username: str, client: str, limits: LoginLimits) -> list[tuple[str, int]]:
    return [
        (_account(username), limits.account_failures),
        (f"address:{client}", limits.address_failures),
    ]


def login_locked(*, username: str, client: str, now: float | None = None) -> int | None:
    """Seconds until ``username`` may be tried again from ``client``; None when neither is
    locked."""
    now = time.time() if now is None else now
    limits = login_limits()
    keys = [f"login:lock:{subject}" for subject, _ in _subjects(username, client, limits)]
    until = max((float(v) for v in cache.get_many(keys).values()), default=0.0)
    if until <= now:
        return None
    return max(1, math.ceil(until - now))


def login_failed(*, username: str, client: str, now: float | None = None) -> None:
    """Count one failed login; lock the username or the address that reaches its limit."""
    now = time.time() if now is None else now
    limits = login_limits()
    for subject, limit in _subjects(username, client, limits):
        if limit <= 0:
            continue  # no limit for this subject
        key = f"login:failures:{subject}"
        if counter_hit(key, timeout=limits.lockout_s) >= limit:
            cache.set(f"login:lock:{subject}", now + limits.lockout_s, timeout=limits.lockout_s + 1)
            cache.delete(key)


def login_succeeded(*, username: str) -> None:
    """The account's failures are forgiven (the address's are not: it may be trying many)."""
    cache.delete(f"login:failures:{_account(username)}")
