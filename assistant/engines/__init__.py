"""Pluggable generation engines, configured like Django's caches.

``settings.CHATSITE_ENGINES`` maps an alias to ``{"BACKEND": "dotted.Class", "OPTIONS": {...}}``.
Each alias is built once per process and shared by every request.
"""

import logging
import threading
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .base import (
    BaseEngine,
    ChatMessage,
    Delta,
    EngineBusy,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerationParams,
)

__all__ = [
    "BaseEngine",
    "ChatMessage",
    "Delta",
    "EngineBusy",
    "EngineError",
    "EngineTimeout",
    "EngineUnavailable",
    "GenerationParams",
    "describe_serving",
    "get_engine",
    "preload",
    "preload_serving",
]

logger = logging.getLogger(__name__)

_engines: dict[str, BaseEngine] = {}
_lock = threading.Lock()


def get_engine(alias: str = "default") -> BaseEngine:
    """The process-wide engine for ``alias``, built (not loaded) on first use."""
    engine = _engines.get(alias)
    if engine is not None:
        return engine
    with _lock:
        if alias not in _engines:
            try:
                config = settings.CHATSITE_ENGINES[alias]
            except KeyError:
                raise EngineUnavailable(f"No engine is configured as {alias!r}.") from None
            backend = import_string(config["BACKEND"])
            _engines[alias] = backend(alias, dict(config.get("OPTIONS", {})))
        return _engines[alias]


def preload(alias: str = "default") -> BaseEngine | None:
    """Build and load an engine now, so the first request does not pay for it.

    A failure is logged, not raised: the site still starts, serves its pages and history, and
    answers chat requests with 503 until the engine can take them.
    """
    try:
        engine = get_engine(alias)
        engine.load()
    except EngineUnavailable as exc:
        logger.error("Engine %r is unavailable (%s); chat requests get 503.", alias, exc)
        return None
    return engine


def preload_serving() -> None:
    """Preload every engine a serving path uses."""
    for alias in sorted(set(settings.CHATSITE_SERVING["ENGINES"].values())):
        preload(alias)


def describe_serving() -> dict[str, dict[str, Any]]:
    """Alias to status, for every engine of a serving path that has a process of its own
    (synchronous: each may ask its process, bounded)."""
    described = {}
    for alias in sorted(set(settings.CHATSITE_SERVING["ENGINES"].values())):
        try:
            info = get_engine(alias).describe()
        except EngineUnavailable:
            continue
        if info is not None:
            described[alias] = info
    return described


@receiver(setting_changed)
def _reset_on_settings_change(*, setting: str, **kwargs: object) -> None:
    if setting == "CHATSITE_ENGINES":
        _engines.clear()
