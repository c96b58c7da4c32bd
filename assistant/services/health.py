"""Liveness and readiness, for systemd, nginx and load balancers.

Liveness says only that the process serves. Readiness says whether a question could be answered
now: the database answers a query, the cache takes a write and gives it back, and every engine a
serving path uses says it can take a request. Each check is bounded in time, so a probe never
hangs on a component that does not answer; what failed is named, with a short reason that holds
no address or secret.
"""

import asyncio
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import connection

from assistant.db import run_db
from assistant.engines import EngineError, get_engine

#: Seconds each component may take to answer a readiness probe.
CHECK_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Readiness:
    #: Component name ("database", "cache", "engine:default") to "ok" or why not.
    checks: dict[str, str]

    @property
    def ready(self) -> bool:
        return all(state == "ok" for state in self.checks.values())


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _cache() -> None:
    key = f"readyz:{uuid.uuid4().hex}"
    cache.set(key, 1, timeout=10)
    try:
        if cache.get(key) != 1:
            raise RuntimeError("a value written was not read back")
    finally:
        cache.delete(key)


async def _engine(alias: str) -> None:
    await get_engine(alias).ready()


async def _outcome(check: "asyncio.Future[None]") -> str:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await check
    except TimeoutError:
        return "timeout"
    except EngineError as exc:
        return exc.code
    except Exception as exc:  # any failure of the component is "not ready", named by its kind
        return type(exc).__name__
    return "ok"


async def readiness_check() -> Readiness:
    """Every component checked at once; the result names each one's state."""
    aliases = sorted(set(settings.CHATSITE_SERVING["ENGINES"].values()))
    checks = {
        "database": asyncio.ensure_future(run_db(_database)),
        "cache": asyncio.ensure_future(run_db(_cache)),
        **{f"engine:{alias}": asyncio.ensure_future(_engine(alias)) for alias in aliases},
    }
    states = await asyncio.gather(*(_outcome(check) for check in checks.values()))
    return Readiness(dict(zip(checks, states, strict=True)))
