"""Who is asking: the owner key that scopes conversations, resolved from the session cookie.

Views get ``request.user`` and ``request.session`` from Django's middleware; the streaming
consumer runs without that stack and resolves the same identity here, with Django's own session
store and ``get_user`` (which checks the session's auth hash), in one trip to a worker thread.
"""

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest, HttpResponse


@dataclass(frozen=True, slots=True)
class Identity:
    owner_key: str
    #: A Set-Cookie header value when a new session had to be created for this request.
    set_cookie: str | None = None


def owner_key_for(user: Any, session_key: str | None) -> str:
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    if not session_key:
        raise ValueError("An anonymous owner needs a session")
    return f"session:{session_key}"


def session_ensure(session: Any) -> bool:
    """Give ``session`` a key (saving it) if it has none. True when it was created now."""
    if session.session_key:
        return False
    session["created"] = True
    session.save()
    return True


def identity_resolve(session_key: str | None, *, create: bool = True) -> Identity:
    """Synchronous (ORM): the identity behind a session cookie, creating a session if needed.

    With ``create=False`` a request without a live session gets the empty owner key.
    """
    store = import_module(settings.SESSION_ENGINE).SessionStore
    session = store(session_key)
    request = HttpRequest()
    request.session = session
    # Loads the session; an unknown or expired key leaves it empty and without a key.
    user = get_user(request)
    set_cookie = None
    if not create and not session.session_key and not user.is_authenticated:
        return Identity(owner_key="")
    if session_ensure(session):
        set_cookie = session_cookie_header(session.session_key)
    return Identity(owner_key=owner_key_for(user, session.session_key), set_cookie=set_cookie)


def session_cookie_header(session_key: str) -> str:
    """The Set-Cookie value Django's SessionMiddleware would send for ``session_key``."""
    response = HttpResponse()
    response.set_cookie(
        settings.SESSION_COOKIE_NAME,
        session_key,
        max_age=settings.SESSION_COOKIE_AGE,
        domain=settings.SESSION_COOKIE_DOMAIN,
        path=settings.SESSION_COOKIE_PATH,
        secure=settings.SESSION_COOKIE_SECURE or None,
        httponly=settings.SESSION_COOKIE_HTTPONLY or None,
        samesite=settings.SESSION_COOKIE_SAMESITE,
    )
    return response.cookies[settings.SESSION_COOKIE_NAME].OutputString()
