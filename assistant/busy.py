"""Refusals for a while, as a browser and a script each expect them, and the site's 400 and 500
handlers.

A page load a worker cannot serve now (too many at once, a database that keeps it waiting past
its pool's timeout) is told to come back, never shown an error page: 503 or 429 with
``Retry-After``. A browser's navigation gets the busy page, which loads itself again after that
many seconds; anything else (the page's own fetches, scripts) gets the JSON error the chat API
answers with.
"""

import sys

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import translation
from django.views.defaults import bad_request as django_bad_request
from django.views.defaults import server_error as django_server_error

from assistant import errors, http
from assistant.errors import Rejected

#: What a request refused for a full database pool is told to wait (seconds, at random).
DATABASE_RETRY_S = (2, 6)


def wants_page(request: HttpRequest) -> bool:
    """A browser's navigation, a form's POST included (it takes HTML), rather than a fetch or
    a script."""
    headers = request.headers
    return headers.get("Sec-Fetch-Mode") == "navigate" or "text/html" in headers.get("Accept", "")


def busy_page(request: HttpRequest, refused: Rejected) -> HttpResponse:
    """The refusal as the busy page: the reason, and a page that tries again by itself."""
    http.refusal(refused.error)
    context = {"message": refused.error.message, "retry_after": refused.retry_after}
    response = render(request, "assistant/busy.html", context, status=refused.error.status)
    response.headers["Retry-After"] = str(refused.retry_after)
    response.headers["Cache-Control"] = "no-store"
    # Refused ahead of XFrameOptionsMiddleware (the page line): its header all the same.
    response.headers.setdefault("X-Frame-Options", settings.X_FRAME_OPTIONS)
    return response


def busy_response(request: HttpRequest, refused: Rejected) -> HttpResponse:
    """The refusal as ``request`` expects it: the busy page to a navigation, else JSON. In the
    request's language even where LocaleMiddleware has not run yet."""
    language = translation.get_language_from_request(request)
    with translation.override(language):
        if wants_page(request):
            return busy_page(request, refused)
        response = http.api_error(http.refusal(refused.error), refused.headers())
        response.headers["Cache-Control"] = "no-store"
        return response


def _database_unavailable() -> bool:
    _, exc, _ = sys.exc_info()
    return isinstance(exc, OperationalError | InterfaceError)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler400``: a request Django could not read (a multipart body it cannot parse, a host
    it does not serve, a body over its limits), refused before a view could answer it. Django's
    plain page to a navigation, the JSON error to anything else, as the chat API answers."""
    if wants_page(request):
        return django_bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        return http.api_error(errors.BAD_HOST)
    if isinstance(exception, RequestDataTooBig):
        return http.api_error(errors.BODY_TOO_LARGE)
    return http.api_error(errors.BAD_REQUEST)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``. A database that could not serve the request (its pool gave no connection
    within CHATSITE_DB_POOL_TIMEOUT, or it is down) is not the site's fault and passes: 503
    ``database_unavailable`` with a Retry-After. Anything else is a 500: Django's plain page to
    a navigation, the JSON error to anything else. Nothing here touches the database."""
    if _database_unavailable():
        refused = Rejected.spread(errors.DATABASE_UNAVAILABLE, *DATABASE_RETRY_S)
        return busy_response(request, refused)
    if wants_page(request):
        return django_server_error(request)
    return http.api_error(errors.SERVER_FAILED)
