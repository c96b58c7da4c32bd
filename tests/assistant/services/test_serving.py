"""The sticky split: stable buckets, the configured share, and what the breaker and the mode do."""

import uuid

import pytest
from django.test import override_settings

from assistant.errors import Rejected
from assistant.models import BreakerEvent, ServingState
from assistant.services.serving import split_change, split_load
from assistant.services.serving_state import BUCKETS, Split, bucket_of


def make_split(percent: float, *, mode: str = "auto", breaker: str = "closed") -> Split:
    return Split(
        baseline="direct",
        candidate="django",
        percent=percent,
        percent_source="dashboard",
        mode=mode,
        breaker=breaker,
        breaker_since=None,
        updated_at=None,
        updated_by="",
    )


KEYS = [uuid.UUID(int=i * 7919 + 12345).hex for i in range(10_000)]


def test_a_key_always_lands_in_the_same_bucket() -> None:
    assert [bucket_of(k) for k in KEYS[:200]] == [bucket_of(k) for k in KEYS[:200]]
    # Pinned: a change of hash function would silently move students to the other path.
    assert (bucket_of("abc"), bucket_of("abd")) == (1929, 693)
    assert all(0 <= bucket_of(k) < BUCKETS for k in KEYS)


@pytest.mark.parametrize("percent", [1, 10, 25, 50, 90])
def test_the_candidate_gets_its_share_within_two_points(percent: float) -> None:
    split = make_split(percent)
    share = sum(split.route(k) == "django" for k in KEYS) / len(KEYS) * 100
    assert abs(share - percent) <= 2, share


def test_routing_is_sticky_and_raising_the_share_only_adds_candidates() -> None:
    at_10, at_30 = make_split(10), make_split(30)
    first = {k: at_10.route(k) for k in KEYS}
    assert first == {k: at_10.route(k) for k in KEYS}
    moved_back = [k for k in KEYS if first[k] == "django" and at_30.route(k) != "django"]
    assert moved_back == []


def test_the_breaker_and_the_mode_decide_before_the_share() -> None:
    key = next(k for k in KEYS if bucket_of(k) < 100)  # in the first 1%
    assert make_split(50).route(key) == "django"
    assert make_split(50, breaker="open").route(key) == "direct"
    assert make_split(50, mode="force_baseline").route(key) == "direct"
    assert make_split(50, breaker="half_open").effective_percent == 5
    assert make_split(0, mode="force_candidate").route(key) == "django"
    assert make_split(0, mode="force_candidate", breaker="open").route(key) == "django"
    # No session yet: the baseline, unless the candidate is forced.
    assert make_split(99).route(None) == "direct"


@pytest.mark.django_db
@override_settings(
    CHATSITE_SERVING={
        "ENGINES": {"direct": "default", "django": "default"},
        "BASELINE": "direct",
        "CANDIDATE": "django",
        "CANDIDATE_PERCENT": 20.0,
        "REFRESH_S": 1.0,
    }
)
def test_the_share_comes_from_settings_until_staff_set_it() -> None:
    assert split_load().percent == 20.0
    assert split_load().percent_source == "settings"
    split = split_change(percent=35.5, mode=None, actor="teacher")
    assert (split.percent, split.percent_source) == (35.5, "dashboard")
    assert ServingState.objects.get(pk=1).candidate_percent == 35.5
    event = BreakerEvent.objects.get()
    assert event.kind == "split_changed" and event.actor == "teacher"
    assert "35.5%" in event.message and "20%" in event.message


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("percent", "mode"), [(-1, None), (100.5, None), (None, "sometimes"), (None, "")]
)
def test_an_invalid_split_is_refused_and_nothing_changes(percent: float, mode: str) -> None:
    with pytest.raises(Rejected) as refused:
        split_change(percent=percent, mode=mode, actor="teacher")
    assert refused.value.error.status == 400
    assert not BreakerEvent.objects.exists()
