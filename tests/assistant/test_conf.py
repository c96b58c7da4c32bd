"""``assistant.conf.settings``: Django's settings read without the lazy object, followed
through every change Django announces."""

from typing import Any

import django.conf
from django.test import override_settings

from assistant import conf


def test_it_is_the_object_djangos_settings_stand_for() -> None:
    assert conf.settings is django.conf.settings._wrapped
    assert conf.settings.CHATSITE_STREAM is django.conf.settings.CHATSITE_STREAM


def test_it_follows_override_settings_in_and_out() -> None:
    before = conf.settings.CHATSITE_STREAM
    with override_settings(CHATSITE_STREAM={**before, "MAX_MESSAGE_CHARS": 7}):
        assert conf.settings.CHATSITE_STREAM["MAX_MESSAGE_CHARS"] == 7
        assert conf.settings is django.conf.settings._wrapped
    assert conf.settings.CHATSITE_STREAM is before
    assert conf.settings is django.conf.settings._wrapped


def test_it_follows_the_settings_fixture_and_a_setting_assigned(settings: Any) -> None:
    conf.settings.CSRF_COOKIE_NAME  # looked up before the change  # noqa: B018
    settings.CSRF_COOKIE_NAME = "another-csrf-cookie"
    assert conf.settings.CSRF_COOKIE_NAME == "another-csrf-cookie"
    # Assigned straight to Django's settings: to the object the fixture put in place, which it
    # takes away again at the end of the test.
    django.conf.settings.SESSION_COOKIE_NAME = "another-session-cookie"
    assert conf.settings.SESSION_COOKIE_NAME == "another-session-cookie"
