"""Middleware that keeps the Django serving path's event streams unbuffered and spares it the
worst thread hops.

Django runs a sync-only middleware in an async stack on its thread-sensitive executor for every
request. WhiteNoise's middleware is sync-only, so it is wrapped: static paths are served by it on
a worker thread; everything else goes straight on. (Django's own ``MiddlewareMixin`` hooks still
cost their hops under ASGI: see docs/serving.md.)
"""

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from django.middleware.gzip import GZipMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware

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
