"""Who owns a conversation, resolved from the session cookie as Django's middleware would; and
the page's sessions, the only ones there are, issued a limited number per address."""

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.backends.cached_db import KEY_PREFIX, SessionStore
from django.core.cache import caches
from django.test import Client, override_settings
from django.utils.crypto import salted_hmac

from assistant.errors import Rejected
from assistant.services.classrooms import SESSION_CLASS
from assistant.services.identity import (
    OWNER_SALT,
    identity_in_memory,
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


def _logged_in(name: str) -> tuple[User, str]:
    """A user logged in through Django's test client, and their session's key."""
    user = User.objects.create_user(name, password="pw-12345-long")
    client = Client()
    client.force_login(user)
    key = client.session.session_key
    assert key is not None
    return user, key


def test_logged_in_user_owns_by_user_id() -> None:
    user, key = _logged_in("ada")
    assert identity_resolve(key).owner_key == f"user:{user.pk}"


def test_session_of_a_changed_password_is_not_trusted() -> None:
    """Django's session hash check applies: after a password change the old session is gone."""
    user, key = _logged_in("bob")
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


def _page_session() -> str:
    client = Client()
    client.get("/")
    key = client.session.session_key
    assert key is not None
    return key


def test_a_page_session_in_memory_is_known_as_the_database_thread_knows_it(
    local_memory: None, django_assert_num_queries: Any
) -> None:
    key = _page_session()
    with django_assert_num_queries(0):
        known = identity_in_memory(key)
    assert known is not None
    assert known == identity_resolve(key)
    assert known.owner_key == f"session:{session_pseudonym(key)}"


def test_what_memory_cannot_tell_is_left_to_the_database_thread(local_memory: None) -> None:
    user, logged_in = _logged_in("cy")
    assert identity_in_memory(logged_in) is None
    assert identity_resolve(logged_in).owner_key == f"user:{user.pk}"

    of_a_class = SessionStore(_page_session())
    of_a_class[SESSION_CLASS] = str(uuid.uuid4())
    of_a_class.save()
    assert of_a_class.session_key is not None
    assert identity_in_memory(of_a_class.session_key) is None

    # Gone from the cache, still in the database: the thread finds it, memory cannot.
    evicted = _page_session()
    caches["default"].delete(KEY_PREFIX + evicted)
    assert identity_in_memory(evicted) is None
    assert identity_resolve(evicted).owner_key == f"session:{session_pseudonym(evicted)}"

    assert identity_in_memory("x" * 32) is None
    assert identity_in_memory("short") is None


def test_sessions_outside_this_process_memory_are_never_read_on_the_loop(
    local_memory: None, tmp_path: Path
) -> None:
    with override_settings(SESSION_ENGINE="django.contrib.sessions.backends.db"):
        assert identity_in_memory(_page_session()) is None
    on_disk = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "sessions": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path),
        },
    }
    with override_settings(CACHES=on_disk, SESSION_CACHE_ALIAS="sessions"):
        key = _page_session()
        assert identity_resolve(key).owner_key  # the session is there, in the file cache
        assert identity_in_memory(key) is None


def test_a_pseudonym_is_djangos_salted_hmac_under_the_secret_key_of_the_moment(
    settings: Any,
) -> None:
    key = "k" * 32
    pseudonyms = []
    for secret in ("first-secret-key-" * 4, "second-secret-key-" * 4):
        settings.SECRET_KEY = secret
        expected = salted_hmac(OWNER_SALT, key, algorithm="sha256").hexdigest()
        assert session_pseudonym(key) == expected
        pseudonyms.append(session_pseudonym(key))
    assert pseudonyms[0] != pseudonyms[1]
