"""Keeping the database the size of its retention: old measurements and expired sessions go.

``manage.py prune`` calls ``records_prune`` (deploy/systemd/chatsite-prune.timer runs it daily).
Stream records and breaker events older than ``CHATSITE_RECORDS_KEEP_DAYS`` are deleted in
batches, each its own short transaction, so a year of records never holds a lock for long while
students are answered; the dashboard's sums of them (``TrafficSum``) go too, with the span the
cut-off falls in. Expired sessions go through their backend's ``clear_expired``. The students'
conversations are theirs, and are kept.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import import_module

from django.conf import settings
from django.db import models
from django.utils import timezone

from assistant.models import BreakerEvent, StreamRecord, TrafficSum

BATCH = 5000


@dataclass(frozen=True, slots=True)
class Pruned:
    """How many rows went (or would go, in a dry run), and the cut-off."""

    before: datetime
    records: int
    breaker_events: int
    sessions_cleared: bool


def _old_rows_delete(
    model: type[models.Model], *, before: datetime, dry_run: bool, batch: int
) -> int:
    old = model.objects.filter(created_at__lt=before)
    if dry_run:
        return old.count()
    deleted = 0
    while True:
        # Oldest first, on the created_at index: each batch reads only rows it deletes.
        ids = list(old.order_by("created_at").values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += model.objects.filter(pk__in=ids).delete()[0]


def records_prune(*, days: int | None = None, dry_run: bool = False, batch: int = BATCH) -> Pruned:
    """Delete what is older than ``days`` (default ``CHATSITE_RECORDS_KEEP_DAYS``; 0 keeps
    every record), and the sessions that have expired (one statement: Django's
    ``clear_expired``)."""
    keep = settings.CHATSITE_RETENTION["RECORDS_DAYS"] if days is None else days
    before = timezone.now() - timedelta(days=keep)
    records = events = 0
    if keep > 0:  # 0 (or less): keep every record, as 0 turns other limits off
        records = _old_rows_delete(StreamRecord, before=before, dry_run=dry_run, batch=batch)
        events = _old_rows_delete(BreakerEvent, before=before, dry_run=dry_run, batch=batch)
        if not dry_run:
            # The dashboard's sums of those records: one statement.
            TrafficSum.objects.filter(start__lt=before).delete()
    if not dry_run:
        import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()
    return Pruned(
        before=before, records=records, breaker_events=events, sessions_cleared=not dry_run
    )
