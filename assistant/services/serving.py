"""The split as stored, shared by every process, and this process's copy of it.

The split lives in one database row (``ServingState``), so every Daphne process sees the same
one. Reading it on each request would put a query on the path to the first token; instead each
process keeps a copy (``current``) that ``services/serving_refresh.py`` refreshes every
``REFRESH_S`` seconds (one second by default), so a change made on the dashboard takes effect
everywhere within two seconds and the routing decision itself is a hash and a comparison
(``serving_state.Split.route``).
"""

from django.db import transaction

from assistant import errors
from assistant.errors import Rejected
from assistant.models import BreakerEvent, ServingState
from assistant.services.serving_state import Mode, Split, split_from


def serving_state_get(*, for_update: bool = False) -> ServingState:
    """Synchronous (ORM): the one state row, created with the defaults if missing."""
    rows = ServingState.objects.select_for_update() if for_update else ServingState.objects
    state = rows.filter(pk=1).first()
    if state is None:
        state, _ = ServingState.objects.get_or_create(pk=1)
    return state


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
    current.split = after
    return after


class _Current:
    """This process's copy of the split (None until first read)."""

    split: Split | None = None


current = _Current()
