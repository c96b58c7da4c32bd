"""``manage.py prune`` (``services/retention.py``): measurements older than the retention and
expired sessions go, everything newer and every conversation stays. On the production
profile's run this is PostgreSQL."""

import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.sessions.backends.cached_db import SessionStore
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.utils import timezone

from assistant.models import BreakerEvent, Conversation, ServingState, StreamRecord, TrafficSum
from assistant.services.retention import records_prune

pytestmark = pytest.mark.django_db


def record(*, days_ago: float) -> StreamRecord:
    return StreamRecord(
        request_id=uuid.uuid4().hex,
        created_at=timezone.now() - timedelta(days=days_ago),
        owner_key="session:test",
        path="direct",
        engine="scripted",
        outcome="ok",
    )


def event(*, days_ago: float) -> BreakerEvent:
    return BreakerEvent(
        created_at=timezone.now() - timedelta(days=days_ago),
        kind=BreakerEvent.Kind.TRIPPED,
        breaker=ServingState.Breaker.OPEN,
        message="test",
    )


def session(*, expires_in_days: float) -> str:
    store = SessionStore()
    store["seen"] = True
    store.set_expiry(timezone.now() + timedelta(days=expires_in_days))
    store.save()
    assert store.session_key is not None
    return store.session_key


@pytest.fixture
def history() -> dict[str, Any]:
    """Records and events 200, 91 and 89 days old and from today; one expired session and one
    live; a conversation begun long ago."""
    StreamRecord.objects.bulk_create([record(days_ago=d) for d in (200, 91, 89, 0)])
    BreakerEvent.objects.bulk_create([event(days_ago=d) for d in (200, 91, 89, 0)])
    conversation = Conversation.objects.create(owner_key="session:test", title="old")
    Conversation.objects.filter(pk=conversation.pk).update(
        created_at=timezone.now() - timedelta(days=400)
    )
    return {
        "expired": session(expires_in_days=-1),
        "live": session(expires_in_days=14),
        "conversation": conversation.pk,
    }


def run(*args: str) -> str:
    out = StringIO()
    call_command("prune", *args, stdout=out)
    return out.getvalue()


def test_older_than_the_retention_goes(history: dict[str, Any]) -> None:
    """Keeping 90 days: the 200- and 91-day-old rows go, the rest stay; the expired session
    goes, the live one and the old conversation stay."""
    said = run("--days", "90")
    assert "deleted 2 stream records and 2 breaker events" in said
    assert StreamRecord.objects.count() == BreakerEvent.objects.count() == 2
    oldest = timezone.now() - timedelta(days=90)
    assert not StreamRecord.objects.filter(created_at__lt=oldest).exists()
    sessions = set(Session.objects.values_list("session_key", flat=True))
    assert history["live"] in sessions and history["expired"] not in sessions
    assert Conversation.objects.filter(pk=history["conversation"]).exists()


def test_the_dashboards_sums_go_with_their_records() -> None:
    """Sums of the dashboard's minutes and hours older than the retention go with the records
    they sum up; newer ones stay."""
    for days in (91, 89):
        start = (timezone.now() - timedelta(days=days)).replace(second=0, microsecond=0)
        TrafficSum.objects.create(start=start, span_s=60, paths={})
    run("--days", "90")
    assert TrafficSum.objects.count() == 1
    assert TrafficSum.objects.get().start > timezone.now() - timedelta(days=90)


def test_a_dry_run_counts_and_deletes_nothing(history: dict[str, Any]) -> None:
    said = run("--dry-run", "--days", "30")
    assert "would delete 3 stream records and 3 breaker events" in said
    assert StreamRecord.objects.count() == BreakerEvent.objects.count() == 4
    assert Session.objects.filter(session_key=history["expired"]).exists()


def test_days_and_the_setting_choose_the_cut(history: dict[str, Any], settings: Any) -> None:
    run()  # the default keeps a year: nothing here is that old
    assert StreamRecord.objects.count() == 4
    run("--days", "100")
    assert StreamRecord.objects.count() == 3
    settings.CHATSITE_RETENTION = {"RECORDS_DAYS": 1}
    run()
    assert StreamRecord.objects.count() == 1


def test_a_retention_of_zero_keeps_every_record(history: dict[str, Any], settings: Any) -> None:
    """0 turns pruning of records off, as 0 turns other limits off; sessions still expire."""
    settings.CHATSITE_RETENTION = {"RECORDS_DAYS": 0}
    assert "deleted 0 stream records and 0 breaker events" in run()
    assert StreamRecord.objects.count() == BreakerEvent.objects.count() == 4
    assert not Session.objects.filter(session_key=history["expired"]).exists()


def test_batches_delete_everything_old() -> None:
    """More old rows than one batch: each batch its own delete, until none is left."""
    StreamRecord.objects.bulk_create([record(days_ago=100) for _ in range(7)])
    pruned = records_prune(days=90, batch=3)
    assert pruned.records == 7
    assert not StreamRecord.objects.exists()


@pytest.mark.parametrize("days", ["0", "-3", "soon"])
def test_a_retention_under_a_day_is_refused(days: str) -> None:
    with pytest.raises(CommandError, match="--days"):
        call_command("prune", "--days", days)
