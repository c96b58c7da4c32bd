"""Who owns a conversation, resolved from the session cookie as Django's middleware would."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from assistant.services.identity import identity_resolve

pytestmark = pytest.mark.django_db


def test_no_cookie_creates_a_session_and_a_cookie_for_it() -> None:
    identity = identity_resolve(None)
    assert identity.owner_key.startswith("session:")
    assert identity.set_cookie is not None
    key = identity.owner_key.removeprefix("session:")
    assert identity.set_cookie.startswith(f"sessionid={key};")
    assert "HttpOnly" in identity.set_cookie and "SameSite=Lax" in identity.set_cookie


def test_existing_session_is_reused_without_a_cookie() -> None:
    client = Client()
    client.get("/")
    key = client.session.session_key
    identity = identity_resolve(key)
    assert identity.owner_key == f"session:{key}"
    assert identity.set_cookie is None


def test_logged_in_user_owns_by_user_id() -> None:
    user = User.objects.create_user("ada", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    identity = identity_resolve(client.session.session_key)
    assert identity.owner_key == f"user:{user.pk}"


def test_session_of_a_changed_password_is_not_trusted() -> None:
    """Django's session hash check applies: after a password change the old session is anonymous."""
    user = User.objects.create_user("bob", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    key = client.session.session_key
    user.set_password("another-pw-67890")
    user.save()
    identity = identity_resolve(key)
    assert identity.owner_key != f"user:{user.pk}"
    assert identity.owner_key.startswith("session:")
    assert identity.set_cookie is not None
