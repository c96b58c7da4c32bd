"""Django's CSRF check and request log, Channels' dispatch and prometheus_client's histogram
values (see the package docstring)."""

from collections.abc import Callable, Mapping
from typing import Any

from channels.consumer import get_handler_name
from django.middleware.csrf import CsrfViewMiddleware

# --- Django: the reason of a failed CSRF check -------------------------------------------


class CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, whose ``process_request``/``process_view`` answer with the reason
    of a refusal (a ``str``) instead of a 403 page, and None when the request passes.

    Relies on ``CsrfViewMiddleware`` routing every refusal through its private
    ``_reject(request, reason)`` and returning what that returns.
    """

    def _reject(self, request: Any, reason: str) -> str:  # type: ignore[override]
        return reason


# --- Django: a response its request log should not write ---------------------------------


def response_logged(response: Any) -> None:
    """Have Django's request log skip ``response``: a refusal the site counts itself
    (``ai_rejections_total``) is no error, and a burst of them would write an ERROR line
    ("Service Unavailable: /") for each.

    Relies on ``django.utils.log.log_response``, which the handlers call for every response of
    400 or more, returning at once when the response's ``_has_been_logged`` is true.
    """
    response._has_been_logged = True


# --- Channels: dispatching a message to its handler --------------------------------------


def consumer_handler(consumer: Any, message: Mapping[str, Any]) -> Callable[..., Any] | None:
    """The method of ``consumer`` that Channels' ``AsyncConsumer.dispatch`` calls for ``message``
    (``http.request`` → ``http_request``), or None: for a ``dispatch`` that skips the
    ``aclose_old_connections()`` hop the stock one makes before every handler.

    Relies on ``channels.consumer.get_handler_name``.
    """
    return getattr(consumer, get_handler_name(message), None)


# --- prometheus_client: what a histogram's observe updates ---------------------------------


def histogram_values(child: Any) -> tuple[list[float], Any, list[Any]]:
    """A labelled histogram's bucket bounds (the last one +Inf), the value of its sum and the
    values of its buckets, each with ``inc(amount)``: what ``Histogram.observe`` updates
    (``_upper_bounds``, ``_sum``, ``_buckets``; in multiprocess mode each value is kept in the
    process's file)."""
    return child._upper_bounds, child._sum, child._buckets
