"""Daphne as chatsite runs it: ``python -m chatsite.server`` takes Daphne's own arguments.

One addition: a request must arrive whole, its headers and its body, within
``CHATSITE_REQUEST_TIMEOUT_S`` (10 s) of its first line. Daphne (Twisted) reads a body to its end
before the application sees the request, so the application cannot stop a client that trickles
its body a byte every few seconds: that client would hold the connection for as long as it
liked. Such a request is answered 408 with the JSON error every API answers, and its connection
closed. Daphne's own timeout check, every 2 s, makes the check: a late request is refused
between 10 and 12 s after it began.

Behind nginx this never fires: nginx reads the whole body before it passes the request on (see
docs/security.md for what bounds a slow client there).
"""

import logging
import time
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.http_protocol import WebRequest
from daphne.server import Server

logger = logging.getLogger("assistant.server")


def _request_scope(request: WebRequest) -> dict[str, Any]:
    """What ``http.security_headers`` needs of a request that has not been fully received."""
    headers = [
        (name.lower(), value)
        for name, values in request.requestHeaders.getAllRawHeaders()
        for value in values
    ]
    return {"scheme": "https" if request.isSecure() else "http", "headers": headers}


def request_refuse_late(request: WebRequest) -> None:
    """Answer ``request`` 408 and close its connection; nothing more of it is read."""
    from assistant import errors, http  # after Django's settings

    transport = request.channel.transport
    transport.pauseProducing()  # read no more of this connection
    error = http.refusal(errors.REQUEST_TIMEOUT)
    body = error.body()
    head = [
        (b"content-length", str(len(body)).encode("ascii")),
        (b"connection", b"close"),
        *http.json_response_headers(_request_scope(request)),
    ]
    lines = [b"HTTP/1.1 408 Request Timeout", *(name + b": " + value for name, value in head)]
    transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
    transport.loseConnection()


class ChatsiteServer(Server):
    """Daphne's server, refusing requests that do not arrive in time."""

    def timeout_checker(self) -> None:
        from django.conf import settings

        limit = settings.CHATSITE_CLIENTS["REQUEST_TIMEOUT_S"]
        if limit > 0:
            started_before = time.time() - limit
            for request, details in list(self.connections.items()):
                if (
                    isinstance(request, WebRequest)
                    and not hasattr(request, "request_start")  # still being received
                    and "disconnected" not in details
                    and not getattr(request, "chatsite_refused", False)
                    and details["connected"] < started_before
                ):
                    request.chatsite_refused = True
                    logger.warning(
                        "Refused a request from %s that took over %g s to arrive",
                        getattr(request.channel.transport.getPeer(), "host", "?"),
                        limit,
                    )
                    request_refuse_late(request)
        super().timeout_checker()


class ChatsiteCommandLine(CommandLineInterface):
    server_class = ChatsiteServer


def main() -> None:
    ChatsiteCommandLine.entrypoint()


if __name__ == "__main__":
    main()
