"""Other projects' private internals that chatsite relies on, checked against the installed
releases. When an upgrade changes one of them, these fail by name, before a stream misbehaves.

- Twisted: ``assistant.transport.buffered_bytes`` reads a transport's private write buffers, to
  drop a client that stopped reading.
- Django: ``assistant.http._CsrfCheck`` overrides ``CsrfViewMiddleware._reject`` to get the
  reason of a failed CSRF check instead of a 403 page.
"""

import inspect
import io
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.middleware.csrf import CsrfViewMiddleware
from twisted.internet import abstract

from assistant import errors
from assistant.http import csrf_error
from assistant.transport import buffered_bytes


class _Reactor:
    """Enough of a reactor for a FileDescriptor that is never really polled."""

    def addWriter(self, _: object) -> None: ...

    def removeWriter(self, _: object) -> None: ...


class _OneBytePerWrite(abstract.FileDescriptor):
    """A descriptor whose socket takes one byte per write, as a slow client's would."""

    def writeSomeData(self, data: Any) -> int:
        return 1 if len(data) else 0


def test_buffered_bytes_follows_twisteds_write_buffers() -> None:
    """Bytes written count as buffered; each byte the socket takes leaves the count, whether it
    sits in Twisted's queue of pieces or in the joined buffer."""
    transport = _OneBytePerWrite(reactor=_Reactor())
    transport.connected = True

    assert buffered_bytes(transport) == 0
    transport.write(b"abc")
    transport.write(b"de")
    assert buffered_bytes(transport) == 5
    transport.doWrite()  # joins the queued pieces and writes one byte
    assert buffered_bytes(transport) == 4
    transport.write(b"fgh")
    assert buffered_bytes(transport) == 7
    for _ in range(7):
        transport.doWrite()
    assert buffered_bytes(transport) == 0


def test_csrf_reject_hook_still_exists_with_its_signature() -> None:
    """CsrfViewMiddleware still routes every refusal through ``_reject(request, reason)``."""
    parameters = list(inspect.signature(CsrfViewMiddleware._reject).parameters)

    assert parameters == ["self", "request", "reason"]
    assert "self._reject(" in inspect.getsource(CsrfViewMiddleware.process_view)


def test_csrf_check_gives_the_reason_for_a_missing_token(settings: Any) -> None:
    """A POST with no CSRF cookie or token is refused with Django's own reason in the message."""
    settings.ALLOWED_HOSTS = ["testserver"]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/chat/stream",
        "query_string": b"",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 50000),
    }
    refused = csrf_error(ASGIRequest(scope, io.BytesIO(b"{}")))

    assert refused is not None and refused.code == errors.CSRF_FAILED.code
    assert "CSRF cookie not set" in refused.message
