"""Who owns a conversation, resolved from the session cookie as Django's middleware would; and
the page's sessions, the only ones there are, issued a limited number per address."""

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.cached_db import SessionStore
from django.test import Client, override_settings

from assistant.errors import Rejected
from assistant.services.identity import (
    identity_required,
    identity_resolve,
    session_issue,
    session_pseudonym,
)

pytestmark = pytest.mark.django_db

LIMITS = {"TRUSTED_PROXIES": [], "NEW_SESSIONS_PER_MINUTE": 3, "STREAMS_PER_ADDRESS": 0}


def test_no_cookie_has_no_owner_and_creates_nothing() -> None:
    assert identity_resolve(None).owner_key == ""
    with pytest.raises(Rejected) as refused:
        identity_required(None)
    assert (refused.value.error.status, refused.value.error.code) == (403, "session_required")


def test_an_unknown_or_expired_cookie_has_no_owner() -> None:
    assert identity_resolve("x" * 32).owner_key == ""


def test_the_page_session_is_reused() -> None:
    client = Client()
    client.get("/")
    key = client.session.session_key
    assert identity_required(key).owner_key == f"session:{session_pseudonym(key)}"


def test_logged_in_user_owns_by_user_id() -> None:
    user = User.objects.create_user("ada", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    identity = identity_resolve(client.session.session_key)
    assert identity.owner_key == f"user:{user.pk}"


def test_session_of_a_changed_password_is_not_trusted() -> None:
    """Django's session hash check applies: after a password change the old session is gone."""
    user = User.objects.create_user("bob", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    key = client.session.session_key
    user.set_password("another-pw-67890")
    user.save()
    assert identity_resolve(key).owner_key == ""


@override_settings(CHATSITE_CLIENTS=LIMITS)
def test_new_sessions_are_limited_per_address_and_existing_ones_are_not() -> None:
    issued = [SessionStore() for _ in range(3)]
    assert all(session_issue(s, client="203.0.113.9") for s in issued)
    with pytest.raises(Rejected) as refused:
        session_issue(SessionStore(), client="203.0.113.9")
    assert refused.value.error.code == "new_sessions_limited"
    assert 1 <= refused.value.retry_after <= 60
    # Another address is counted apart; a live session is not new and costs nothing.
    assert session_issue(SessionStore(), client="198.51.100.4")
    again = SessionStore(issued[0].session_key)
    assert session_issue(again, client="203.0.113.9") is False
