"""Daphne as chatsite runs it: ``python -m chatsite.server`` takes Daphne's own arguments.

Six additions. **uvloop** under Twisted's asyncio reactor (``CHATSITE_EVENT_LOOP``,
chatsite/event_loop.py), installed before Daphne makes its event loop.

**Writes at the end of the loop's turn**: what a connection was given during a turn of the event
loop is sent as that turn ends, in one ``send`` as before, not after the loop has registered the
socket for writing, polled it and taken it off again (two ``epoll_ctl`` calls and a round of the
loop per frame; ``internals.writes_at_turn_end``).

**Less of Twisted's work per request**: Twisted does not parse the body of every POST as a
form, which Daphne never reads (its Content-Type alone took 45 us through the email package);
and Daphne reaches Twisted's HTTP module itself, not the stand-in that warns about its
deprecated names (1.9 us for every name read through it, one for every frame written;
``internals.daphne_http_direct``).

**A graceful drain**: on SIGTERM (``systemctl stop`` or ``restart``) the worker
stops accepting connections (those already waiting in its backlog are accepted first), so nginx
sends new requests to the other workers; each connection it serves closes once its response
ends (``Connection: close``), so nginx keeps none of them for later (one nginx keeps idle
meanwhile is not closed under it: a question sent on it at that moment would be lost; it is
served, then closed); the staff dashboard's live streams end (their pages reconnect elsewhere);
it goes on serving the requests it has open, answers included, until none is left or
``CHATSITE_DRAIN_S`` (25 s) has passed; then it stops as Daphne does (what is still open is
cancelled, and every answer stored). A second SIGTERM stops it at once.

**A longer listen backlog**: ``CHATSITE_LISTEN_BACKLOG`` (2048) connections wait for the worker
to accept them, where Twisted's default holds 50; a burst beyond that would have nginx's
connections time out and the students get errors.

**A deadline for arriving**: a request must arrive whole, its headers and its body, within
``CHATSITE_REQUEST_TIMEOUT_S`` (10 s) of its first line. Daphne (Twisted) reads a body to its end
before the application sees the request, so the application cannot stop a client that trickles
its body a byte every few seconds: that client would hold the connection for as long as it
liked. Such a request is answered 408 with the JSON error every API answers, and its connection
closed. Daphne's own timeout check, every 2 s, makes the check: a late request is refused
between 10 and 12 s after it began.

Behind nginx this never fires: nginx reads the whole body before it passes the request on (see
docs/security.md for what bounds a slow client there).
"""

import asyncio
import logging
import time
from typing import Any

from chatsite.event_loop import event_loop_install, event_loop_name

event_loop_install()  # before Daphne makes its event loop (chatsite/event_loop.py)

from daphne.http_protocol import WebRequest  # noqa: E402
from daphne.server import Server  # noqa: E402

from assistant import internals  # noqa: E402
from assistant.worker import server_set  # noqa: E402

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

    transport = internals.request_transport(request)
    transport.pauseProducing()  # read no more of this connection
    transport.write(http.raw_error_response(errors.REQUEST_TIMEOUT, _request_scope(request)))
    transport.loseConnection()


def refuse_late_requests(server: Server) -> None:
    """Refuse each request on ``server`` still arriving ``REQUEST_TIMEOUT_S`` after it began."""
    from django.conf import settings  # read when serving: the settings may not be set up yet

    limit = settings.CHATSITE_CLIENTS["REQUEST_TIMEOUT_S"]
    if limit <= 0:
        return
    started_before = time.time() - limit
    for request, began in internals.requests_arriving(server):
        if began < started_before and not getattr(request, "chatsite_refused", False):
            request.chatsite_refused = True
            logger.warning(
                "Refused a request from %s that took over %g s to arrive",
                getattr(internals.request_transport(request).getPeer(), "host", "?"),
                limit,
            )
            request_refuse_late(request)


class Drain:
    """A worker's graceful stop: ``begin`` on SIGTERM, then a look every ``CHECK_S`` until its
    open requests have ended (twice in a row: a request on a connection kept alive may just
    be arriving) or the limit has passed."""

    CHECK_S = 0.1

    def __init__(self, server: Server) -> None:
        self.server = server
        self.deadline: float | None = None
        self.stopping = False
        self._quiet = 0

    def begin(self) -> None:
        from django.conf import settings

        from assistant.services.background import drain_begin

        if self.deadline is not None:
            if not self.stopping:
                logger.warning("Asked again to stop: stopping now")
                self._stop()
            return
        limit = settings.CHATSITE_STREAM["DRAIN_S"]
        self.deadline = time.monotonic() + limit
        self.server.chatsite_drain()  # type: ignore[attr-defined]
        drain_begin()  # endless streams (the staff dashboard's) end now
        for port in internals.listening_ports(self.server):
            internals.listener_close(port)
        connections = internals.connections_close_after_response(self.server)
        open_now = len(internals.requests_open(self.server))
        logger.info(
            "Draining: accepting no more, %d requests open on %d connections, up to %g s",
            open_now,
            connections,
            limit,
        )
        self._check()

    def _stop(self) -> None:
        self.stopping = True
        self.server.stop()

    def _check(self) -> None:
        from twisted.internet import reactor

        assert self.deadline is not None
        if self.stopping:
            return
        internals.connections_close_after_response(self.server)
        open_now = internals.requests_open(self.server)
        self._quiet = 0 if open_now else self._quiet + 1
        if self._quiet >= 2:
            logger.info("Drained: every open request has ended")
            self._stop()
        elif time.monotonic() >= self.deadline:
            logger.warning("Drain limit reached with %d requests open: stopping", len(open_now))
            self._stop()
        else:
            reactor.callLater(self.CHECK_S, self._check)


def backlog_set(endpoint: str, backlog: int) -> str:
    """A Twisted endpoint description listening with ``backlog``, unless it names its own (a
    TCP or Unix socket; a socket passed in by file descriptor keeps the one it was made with)."""
    kind = endpoint.split(":", 1)[0]
    if kind not in ("tcp", "tcp6", "unix") or ":backlog=" in endpoint:
        return endpoint
    return f"{endpoint}:backlog={backlog}"


class ChatsiteServer(internals.daphne_server_class(refuse_late_requests)):  # type: ignore[misc]
    """Daphne's server, refusing requests that do not arrive in time (at each of its timeout
    checks), listening with CHATSITE_LISTEN_BACKLOG, and draining on SIGTERM."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from django.conf import settings  # Daphne imported the application: set up

        super().__init__(*args, **kwargs)
        backlog = settings.CHATSITE_CLIENTS["LISTEN_BACKLOG"]
        internals.server_endpoints_map(self, lambda endpoint: backlog_set(endpoint, backlog))

    def run(self) -> None:
        from twisted.internet import reactor

        internals.on_sigterm(reactor, Drain(self).begin)
        internals.writes_at_turn_end(reactor)
        internals.daphne_http_direct()
        reactor.callWhenRunning(_event_loop_log)
        super().run()


def _event_loop_log() -> None:
    # Called as the reactor starts, before its loop runs: the loop Daphne set as current.
    logger.info("Event loop: %s", event_loop_name(asyncio.get_event_loop()))


def main() -> None:
    server_set("daphne")
    internals.daphne_command_line(ChatsiteServer).entrypoint()


if __name__ == "__main__":
    main()
