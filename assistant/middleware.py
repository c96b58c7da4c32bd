"""Middleware that keeps the Django serving path's event streams unbuffered, spares it the worst
thread hops, and has a burst of page loads wait its turn (``PageLineMiddleware``).

Django runs a sync-only middleware in an async stack on its thread-sensitive executor for every
request. WhiteNoise's middleware is sync-only, so it is wrapped: static paths are served by it on
a worker thread; everything else goes straight on. (Django's own ``MiddlewareMixin`` hooks still
cost their hops under ASGI: see docs/serving.md.)
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from django.middleware.gzip import GZipMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware

from assistant import internals
from assistant.busy import busy_response
from assistant.services.background import failure_taken
from assistant.services.page_line import PageLine, page_line, site_busy

type GetResponse = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


def _not_static(request: HttpRequest) -> None:
    return None


class StaticFilesMiddleware:
    """WhiteNoise for ``STATIC_URL``, as an async-capable middleware."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: GetResponse) -> None:
        if not iscoroutinefunction(get_response):
            raise TypeError("StaticFilesMiddleware runs in an async middleware stack only")
        self.get_response = get_response
        self.whitenoise = WhiteNoiseMiddleware(get_response=_not_static)
        self.serve_static = sync_to_async(self.whitenoise, thread_sensitive=False)
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(self.whitenoise.static_prefix):
            response = await self.serve_static(request)
            if response is not None:
                return response
        return await self.get_response(request)


class EventStreamSafeGZipMiddleware(GZipMiddleware):
    """Django's GZipMiddleware, except for ``text/event-stream``: compressing an event stream
    invites every layer after it to wait for a fuller block before passing tokens on."""

    def process_response(self, request: HttpRequest, response: Any) -> Any:
        if response.get("Content-Type", "").startswith("text/event-stream"):
            return response
        return super().process_response(request, response)


class PageLineMiddleware:
    """Each request waits its turn in the worker's page line (services/page_line.py) before
    anything that may use the database runs; one that waited too long is refused, 503
    ``site_busy`` with Retry-After: the busy page to a navigation, JSON otherwise, counted
    (``ai_rejections_total``) but not written to the log, one line per refusal in a burst.
    Prometheus's scrape never waits (the health probes are answered before Django)."""

    async_capable = True
    sync_capable = False
    UNLIMITED = frozenset({"/metrics"})

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        line = page_line()
        if line is None or request.path_info in self.UNLIMITED:
            return await self.get_response(request)
        if not await line.enter():
            response = busy_response(request, site_busy())
            internals.response_logged(response)
            return response
        # The turn ends when the request's work does, not when its client leaves: a request
        # cancelled by a disconnect leaves its synchronous part running on its thread (asgiref
        # does not wait for it), holding its database connection until it returns.
        work = asyncio.ensure_future(self.get_response(request))
        work.add_done_callback(_turn_end(line))
        return await asyncio.shield(work)


def _turn_end(line: PageLine) -> Callable[["asyncio.Future[HttpResponseBase]"], None]:
    def end(work: "asyncio.Future[HttpResponseBase]") -> None:
        line.leave()
        failure_taken(work)  # a request whose client left has nobody to raise to

    return end
