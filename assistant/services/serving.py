"""Which serving path answers a student: a sticky split, shared by every process.

A session is hashed into one of 10,000 buckets (as nginx's ``split_clients`` does with a
percentage); buckets below ``percent x 100`` go to the candidate. The same session therefore
always lands on the same path while the percentage is unchanged, and raising the percentage only
moves students from the baseline to the candidate, never back and forth.

The split lives in one database row (``ServingState``), so every Daphne process sees the same
one. Reading it on each request would put a query on the path to the first token; instead each
process keeps a copy that a background task refreshes every ``REFRESH_S`` seconds (one second by
default), so a change made on the dashboard takes effect everywhere within two seconds and the
routing decision itself is a hash and a comparison.
"""

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from assistant import errors
from assistant.db import run_db, run_db_write
from assistant.errors import Rejected
from assistant.models import BreakerEvent, ServingState

logger = logging.getLogger(__name__)

BUCKETS = 10_000
Mode = ServingState.Mode
Breaker = ServingState.Breaker


def bucket_of(key: str) -> int:
    """A stable bucket in [0, 10000) for ``key`` (the same in every process and release)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=b"chat-split").digest()
    return int.from_bytes(digest, "big") % BUCKETS


@dataclass(frozen=True, slots=True)
class Split:
    """One reading of the shared state; ``route`` decides a path without any I/O."""

    baseline: str
    candidate: str
    percent: float
    percent_source: str
    mode: str
    breaker: str
    breaker_since: datetime | None
    updated_at: datetime | None
    updated_by: str

    @property
    def effective_percent(self) -> float:
        """The share of buckets the candidate gets right now."""
        if self.mode == Mode.FORCE_BASELINE:
            return 0.0
        if self.mode == Mode.FORCE_CANDIDATE:
            return 100.0
        if self.breaker == Breaker.OPEN:
            return 0.0
        if self.breaker == Breaker.HALF_OPEN:
            return min(self.percent, settings.CHATSITE_BREAKER["HALF_OPEN_PERCENT"])
        return self.percent

    def route(self, key: str | None) -> str:
        """The path for a session key; no key (no session yet) means the baseline."""
        share = self.effective_percent
        if share >= 100:
            return self.candidate
        if key is None or share <= 0:
            return self.baseline
        return self.candidate if bucket_of(key) < share * BUCKETS / 100 else self.baseline

    def describe(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "mode": self.mode,
            "percent": self.percent,
            "percent_source": self.percent_source,
            "effective_percent": self.effective_percent,
            "breaker": self.breaker,
            "breaker_since": self.breaker_since.isoformat() if self.breaker_since else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "updated_by": self.updated_by,
        }


def serving_state_get(*, for_update: bool = False) -> ServingState:
    """Synchronous (ORM): the one state row, created with the defaults if missing."""
    rows = ServingState.objects.select_for_update() if for_update else ServingState.objects
    state = rows.filter(pk=1).first()
    if state is None:
        state, _ = ServingState.objects.get_or_create(pk=1)
    return state


def split_from(state: ServingState) -> Split:
    config = settings.CHATSITE_SERVING
    from_dashboard = state.candidate_percent is not None
    return Split(
        baseline=config["BASELINE"],
        candidate=config["CANDIDATE"],
        percent=state.candidate_percent if from_dashboard else config["CANDIDATE_PERCENT"],
        percent_source="dashboard" if from_dashboard else "settings",
        mode=state.mode,
        breaker=state.breaker,
        breaker_since=state.breaker_since,
        updated_at=state.updated_at,
        updated_by=state.updated_by,
    )


def split_load() -> Split:
    """Synchronous (ORM): the split as stored now."""
    return split_from(serving_state_get())


def split_change(*, percent: float | None, mode: str | None, actor: str) -> Split:
    """Synchronous (ORM): a person changes the share or the mode; logged as an event.

    Putting the mode back to ``auto`` after a trip does not close the breaker: that is the
    breaker's own decision, on fresh figures.
    """
    if percent is not None and not 0 <= percent <= 100:
        raise Rejected(errors.SPLIT_INVALID.with_message("percent must be between 0 and 100."))
    if mode is not None and mode not in Mode.values:
        raise Rejected(
            errors.SPLIT_INVALID.with_message(f"mode must be one of {', '.join(Mode.values)}.")
        )
    with transaction.atomic():
        state = serving_state_get(for_update=True)
        before = split_from(state)
        if percent is not None:
            state.candidate_percent = round(percent, 2)
        if mode is not None:
            state.mode = mode
        state.updated_by = actor
        state.save()
        after = split_from(state)
        BreakerEvent.objects.create(
            kind=BreakerEvent.Kind.SPLIT_CHANGED,
            breaker=state.breaker,
            actor=actor,
            message=(
                f"{actor or 'settings'} set the candidate share to {after.percent:g}% "
                f"(was {before.percent:g}%), mode {after.mode} (was {before.mode})."
            ),
            figures={"percent": after.percent, "mode": after.mode},
        )
    _current.split = after
    return after


class _Current:
    """This process's copy of the split and the task that keeps it fresh."""

    split: Split | None = None
    task: asyncio.Task[None] | None = None
    loaded: asyncio.Future[None] | None = None


_current = _Current()


async def split_current() -> Split:
    """The split to route by: from memory, refreshed in the background.

    The first call in a process (or event loop) waits for one read; the rest never touch the
    database.
    """
    split = _current.split
    task = _current.task
    if (
        split is not None
        and task is not None
        and not task.done()
        and task.get_loop() is asyncio.get_running_loop()
    ):
        return split
    _serving_start()
    loaded = _current.loaded
    assert loaded is not None
    if split is None:
        await asyncio.shield(loaded)
    return _current.split or split_from(ServingState())


def _serving_start() -> None:
    """Start this loop's refresher (and breaker evaluator) unless it runs already."""
    task = _current.task
    loop = asyncio.get_running_loop()
    if task is not None and not task.done() and task.get_loop() is loop:
        return
    _current.loaded = loop.create_future()
    _current.task = loop.create_task(_serving_loop(_current.loaded), name="chatsite-serving")


async def _serving_loop(loaded: asyncio.Future[None]) -> None:
    from assistant.services.breaker import breaker_evaluate  # imports this module

    config = settings.CHATSITE_SERVING
    every = settings.CHATSITE_BREAKER["EVALUATE_S"]
    loop = asyncio.get_running_loop()
    next_evaluation = loop.time() + every
    while True:
        try:
            _current.split = await run_db(split_load)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The database is down or busy: keep routing by the last copy, try again later.
            logger.exception("Could not refresh the serving split")
        if not loaded.done():
            loaded.set_result(None)  # the first request waits for this one read, no more
        try:
            if loop.time() >= next_evaluation:
                next_evaluation = loop.time() + every
                await run_db_write(breaker_evaluate)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Could not evaluate the serving breaker")
        await asyncio.sleep(config["REFRESH_S"])


def engine_alias_for(path: str) -> str:
    return settings.CHATSITE_SERVING["ENGINES"][path]
