"""Reading settings from the environment: typed values, database and Redis URLs."""

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def database_from_url(url: str, *, pool_size: int = 8, pool_timeout: float = 2.0) -> dict[str, Any]:
    """``postgres://user:password@host:port/name?sslmode=require`` as a Django DATABASES entry.

    Connections come from a pool per process (psycopg's, through Django), so a query never waits
    for a new connection and the count stays bounded: under ASGI each request's synchronous code
    may run on a new thread, and per-thread persistent connections would pile up.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfigured(f"DATABASE_URL must be postgres://...; got {parts.scheme}://")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL names no database.")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            **dict(parse_qsl(parts.query)),
            # Waiting for a connection fails after pool_timeout s: while the database is down,
            # a request gets its 503 quickly and the writer's retries keep their pace.
            "pool": {"min_size": 1, "max_size": pool_size, "timeout": pool_timeout},
        },
    }
