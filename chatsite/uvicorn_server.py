"""uvicorn[standard] as chatsite runs it: ``python -m chatsite.uvicorn_server --port 8011``.

The production worker beside ``chatsite.server`` (Daphne), with the same four additions, so
that either serves a class the same way (deploy/systemd/chatsite-uvicorn@.service):

**uvloop and httptools** (``CHATSITE_EVENT_LOOP``: ``uvloop``, or ``asyncio`` for asyncio's own
loop). Under uvicorn, chatsite's CPU per answer and its first token at 50 students are below
Daphne's (docs/performance.md).

**A graceful drain**: on SIGTERM (or SIGINT) the worker stops accepting connections, so nginx
sends new requests to the other workers; idle connections close at once and each busy one once
its response ends; the staff dashboard's live streams end (their pages reconnect elsewhere); it
goes on serving what it has open until nothing is left or ``CHATSITE_DRAIN_S`` (25 s; 0 for
none) has passed; then what is still open is cancelled, every answer stored
(``assistant/lifespan.py``), and the process exits 0. uvicorn logs how many requests it
cancelled, without a traceback for each (``CutByTheStop``). A second signal cancels what is
open at once, and still stores it. uvicorn's own handling differs in two ways chatsite cannot
have: a second SIGTERM there does not hurry the stop, and the process ends by raising the signal
again, which skips ``atexit`` (the worker's live Prometheus gauges would never be marked dead).

**A longer listen backlog**: ``CHATSITE_LISTEN_BACKLOG`` (2048).

**A deadline for arriving**: a request whose line, headers and body have not all arrived within
``CHATSITE_REQUEST_TIMEOUT_S`` (10 s) of its first byte is answered 408 (the API's JSON error)
and its connection closed; the check runs once a second, so between 10 and 11 s.

And as a worker behind nginx: a response's head goes out in one write with the first piece of
its body, as Daphne (Twisted) writes them (``HeadWithBody``: one system call, and one wake-up
of nginx, fewer for every response); idle connections are kept ``KEEP_ALIVE_S`` (uvicorn's
default, 5 s, would close connections nginx keeps for 50 s, and a question nginx sends on one
just as it closes is lost); no access log (nginx logs every request); no ``Server`` header; and
uvicorn's proxy-headers middleware is off, since chatsite reads ``X-Forwarded-For`` itself,
from ``CHATSITE_TRUSTED_PROXIES`` only.

Its server and protocol extend uvicorn's past their documented API (the signal handler, the
start-up, the wait for open requests, the httptools parser's callbacks, the request's cycle):
tests/assistant/test_contracts.py checks each against the installed uvicorn
(``internals.CHECKED_AGAINST``).
"""

import argparse
import asyncio
import logging
import math
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from assistant.loop_redis import loop_redis_allow
from assistant.worker import server_set
from chatsite.event_loop import event_loop_install

logger = logging.getLogger("assistant.server")

#: Seconds an idle connection stays open: above nginx's keepalive_timeout (50 s), as Daphne's 60.
KEEP_ALIVE_S = 60
#: The ASGI application every worker serves.
APPLICATION = "chatsite.asgi:application"


class _HeadKept:
    """The transport, as uvicorn's ``send`` sees it while it writes a response's head: the bytes
    are kept."""

    __slots__ = ("head",)

    def __init__(self) -> None:
        self.head = b""

    def write(self, data: bytes) -> None:
        self.head += data


class _HeadAhead:
    """The transport, as uvicorn's ``send`` sees it while it writes the first piece of a body:
    the kept head goes in the same write, ahead of it."""

    __slots__ = ("head", "transport")

    def __init__(self, head: bytes, transport: asyncio.WriteTransport) -> None:
        self.head: bytes | None = head
        self.transport = transport

    def write(self, data: bytes) -> None:
        head, self.head = self.head, None
        self.transport.write(data if head is None else head + data)

    def flush(self) -> None:
        """Write the head, if no body went with it (a response to ``HEAD``)."""
        if self.head is not None:
            self.write(b"")

    def close(self) -> None:
        self.flush()
        self.transport.close()


class HeadWithBody(RequestResponseCycle):
    """uvicorn's request and response, with the response's head written together with the first
    piece of its body: one write, so one system call and one wake-up of nginx, fewer for every
    response. chatsite sends a stream's head with its first frame, and Django a page's with its
    content, in the same turn of the event loop; a head is never kept past that turn (an
    application that sends it and then waits has it written as the turn ends). While the
    transport is behind (uvicorn's ``send`` would wait for it to drain), a head is written as
    uvicorn writes it."""

    kept: bytes | None = None

    async def send(self, message: Any) -> None:
        if (
            message["type"] == "http.response.start"
            and not self.response_started
            and not self.flow.write_paused
            and not self.disconnected
        ):
            transport, kept = self.transport, _HeadKept()
            self.transport = kept  # type: ignore[assignment]
            try:
                await RequestResponseCycle.send(self, message)  # nothing awaited: not paused
            finally:
                self.transport = transport
            self.kept = kept.head
            asyncio.get_running_loop().call_soon(self.kept_write)
            return
        head = self.kept
        if head is None or message["type"] != "http.response.body" or self.flow.write_paused:
            self.kept_write()
            await RequestResponseCycle.send(self, message)
            return
        self.kept = None
        transport, ahead = self.transport, _HeadAhead(head, self.transport)
        self.transport = ahead  # type: ignore[assignment]
        try:
            await RequestResponseCycle.send(self, message)  # nothing awaited: not paused
        finally:
            self.transport = transport
            if not self.disconnected:
                ahead.flush()

    def kept_write(self) -> None:
        """Write the kept head, if any, on its own."""
        head, self.kept = self.kept, None
        if head is not None and not self.disconnected and not self.transport.is_closing():
            self.transport.write(head)


class ChatsiteHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, noting when the request now arriving began, and writing a
    response's head with its body (``HeadWithBody``)."""

    arriving_since: float | None = None

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Every request's cycle starts here, a pipelined one too (uvicorn made it, stock).
        cycle.__class__ = HeadWithBody
        super()._start_asgi_task(cycle, app)

    def on_message_begin(self) -> None:
        self.arriving_since = time.monotonic()
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self.arriving_since = None
        super().on_message_complete()

    def refuse_late(self) -> None:
        """Answer 408 and close the connection; nothing more of it is read."""
        from assistant import errors, http  # after Django's settings

        self.arriving_since = None
        self.transport.pause_reading()
        self.transport.write(http.raw_error_response(errors.REQUEST_TIMEOUT, self.scope))
        self.transport.close()


def refuse_late_requests(connections: Iterable[object], limit_s: float, now: float) -> None:
    """Refuse each request of ``connections`` still arriving ``limit_s`` after its first byte.
    Not one whose response has begun, nor one the server itself stopped reading
    (a request pipelined behind another one's answer, a body already buffered to uvicorn's
    limit), nor one whose connection is closing."""
    for connection in list(connections):
        if not isinstance(connection, ChatsiteHttpTools):
            continue
        began = connection.arriving_since
        if began is None or now - began < limit_s:
            continue
        cycle = connection.cycle
        if cycle is not None and cycle.response_started:
            continue
        if connection.pipeline or connection.flow.read_paused or connection.transport.is_closing():
            continue
        client = connection.client[0] if connection.client else "?"
        logger.warning("Refused a request from %s that took over %g s to arrive", client, limit_s)
        connection.refuse_late()


class ChatsiteUvicorn(uvicorn.Server):
    """uvicorn's server, draining as ``chatsite.server`` does and refusing late requests."""

    #: Seconds between two looks for requests late to arrive.
    CHECK_S = 1.0

    def __init__(self, config: uvicorn.Config, *, request_timeout_s: float) -> None:
        super().__init__(config)
        self.request_timeout_s = request_timeout_s
        self.hurried = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checking: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: it sets flags, and leaves the rest to the loop.
        from assistant.services.background import drain_begin

        if not self.should_exit:
            self.should_exit = True  # uvicorn stops accepting and drains (its ``shutdown``)
            drain_begin()  # endless streams (the staff dashboard's) end now
        elif not self.hurried and self._loop is not None:
            self.hurried = True
            self._loop.call_soon_threadsafe(self._hurry)

    def _hurry(self) -> None:
        logger.warning("Asked again to stop: stopping now")
        for task in list(self.server_state.tasks):
            task.cancel()  # each answer stops and stores; the lifespan shutdown waits for it

    async def startup(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        if self.request_timeout_s > 0:
            # Serving and draining alike (uvicorn's own ticks stop at the signal).
            self._checking = asyncio.create_task(self._refuse_late())
        await super().startup(sockets)

    async def _refuse_late(self) -> None:
        while True:
            await asyncio.sleep(self.CHECK_S)
            refuse_late_requests(
                self.server_state.connections, self.request_timeout_s, time.monotonic()
            )

    async def shutdown(self, sockets: Any = None) -> None:
        logger.info(
            "Draining: accepting no more, %d requests open on %d connections, up to %g s",
            len(self.server_state.tasks),
            len(self.server_state.connections),
            self.config.timeout_graceful_shutdown,
        )
        try:
            await super().shutdown(sockets)
        finally:
            if self._checking is not None:
                self._checking.cancel()

    async def _wait_tasks_to_complete(self) -> None:
        # uvicorn's wait for the open requests, cancelled when the drain's time is up.
        await super()._wait_tasks_to_complete()
        if not self.hurried:
            logger.info("Drained: every open request has ended")


def graceful_shutdown_s(drain_s: float) -> int:
    """uvicorn's ``timeout_graceful_shutdown`` for a drain of ``drain_s``: it takes whole
    seconds, and a drain is never cut shorter than asked; 0 is no drain (what is open is
    cancelled at once, as under Daphne)."""
    return max(0, math.ceil(drain_s))


class CutByTheStop(logging.Filter):
    """Leaves out uvicorn's "Exception in ASGI application" traceback for a request it cancelled
    at the drain's end (or at a second signal): a request cut by the stop is no failure of the
    application (its answer is stored, and uvicorn logs once how many it cancelled). Any other
    exception is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, asyncio.CancelledError)


def config(host: str, port: int) -> uvicorn.Config:
    """The worker's uvicorn configuration, from chatsite's settings (the application is
    imported, and Django set up, here)."""
    loop = event_loop_install()
    config = uvicorn.Config(
        APPLICATION,
        host=host,
        port=port,
        loop=loop,
        http=ChatsiteHttpTools,
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    config.load()
    from django.conf import settings

    # uvicorn's own lines (start, stop, errors) in the format of chatsite's (plain or JSON).
    logging.getLogger("uvicorn").handlers = list(logging.getLogger("assistant").handlers)
    logging.getLogger("uvicorn.error").addFilter(CutByTheStop())

    config.backlog = settings.CHATSITE_CLIENTS["LISTEN_BACKLOG"]
    config.timeout_graceful_shutdown = graceful_shutdown_s(settings.CHATSITE_STREAM["DRAIN_S"])
    logger.info("Event loop: %s", loop)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chatsite.uvicorn_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    args = parser.parse_args(argv)
    server_set("uvicorn")
    # Its event loop admits questions and gives slots back (loop_redis.py, loop_postgres.py).
    loop_redis_allow()
    worker = config(args.host, args.port)
    from django.conf import settings

    ChatsiteUvicorn(worker, request_timeout_s=settings.CHATSITE_CLIENTS["REQUEST_TIMEOUT_S"]).run()


if __name__ == "__main__":
    main()
