"""The language of a request: the one the student chose on the page (Django's language cookie),
else the first of the browser's (Accept-Language) that the site speaks, else the default.

Pages get it from Django's ``LocaleMiddleware``. A chat stream on the ``direct`` path runs
without Django's middleware, so the router works it out from the ASGI scope the same way, and
the errors that stream sends are in the language the page is in.
"""

import functools
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.http import HttpRequest
from django.utils import translation
from django.utils.functional import Promise

from assistant import conf
from assistant.scope_headers import scope_cookies, scope_meta

#: The HTML ``lang`` of each language code (BCP 47 spells the script with a capital).
HTML_LANG = {"zh-hans": "zh-Hans"}


class _LanguageRequest:
    """What ``translation.get_language_from_request`` reads of a request: its language cookie
    and its Accept-Language header."""

    def __init__(self, cookie: str | None, accept: str) -> None:
        self.COOKIES = {settings.LANGUAGE_COOKIE_NAME: cookie} if cookie is not None else {}
        self.META = {"HTTP_ACCEPT_LANGUAGE": accept} if accept else {}


@functools.lru_cache(maxsize=256)
def _language_of(cookie: str | None, accept: str) -> str:
    """The language ``LocaleMiddleware`` picks for a language cookie and an Accept-Language:
    remembered, as the site's students send the same few (10-20 µs each to work out)."""
    return translation.get_language_from_request(_LanguageRequest(cookie, accept))  # type: ignore[arg-type]


def _forget_languages(**kwargs: Any) -> None:
    _language_of.cache_clear()


setting_changed.connect(_forget_languages)


def scope_language(scope: MutableMapping[str, Any]) -> str:
    """The language code (one of ``settings.LANGUAGES``) for an ASGI request: what
    ``LocaleMiddleware`` would pick for the same request."""
    cookie = scope_cookies(scope).get(conf.settings.LANGUAGE_COOKIE_NAME)
    return _language_of(cookie, scope_meta(scope).get("HTTP_ACCEPT_LANGUAGE", ""))


@contextmanager
def scope_translation(scope: MutableMapping[str, Any]) -> Iterator[str]:
    """Everything within speaks the request's language (errors, frames); yields its code."""
    language = scope_language(scope) if conf.settings.USE_I18N else conf.settings.LANGUAGE_CODE
    with translation.override(language):
        yield language


def strings_translated(strings: dict[str, str | Promise]) -> dict[str, str]:
    """A page's strings for its scripts (``page_strings``, ``dashboard_strings``) in the active
    language."""
    return {key: str(text) for key, text in strings.items()}


def html_lang(language: str) -> str:
    """The page's ``<html lang>`` for a language code: a CJK font for Chinese, a voice for it."""
    return HTML_LANG.get(language, language)


def page_language(request: HttpRequest) -> dict[str, str]:
    """Template context processor: ``html_lang`` for every page."""
    return {"html_lang": html_lang(translation.get_language() or settings.LANGUAGE_CODE)}
