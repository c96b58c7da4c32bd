"""Other projects' internals that chatsite relies on, all in one place.

Every access here goes past the documented API of Daphne, Twisted, Django, Channels, uvicorn or
prometheus_client: private attributes, undocumented methods overridden, object graphs that happen
to hold. Each function or class names what it relies on, and
``tests/assistant/test_contracts.py`` checks each one against the installed release, failing by
name when an upgrade changes it. The rest of the code calls these and keeps its own logic.

Checked against Django 6.1.3, Daphne 4.2.3, Twisted 26.10.0, Channels 4.3.2, uvicorn 0.54.0 and
prometheus_client 0.26.0 (``CHECKED_AGAINST``). ``SUPPORTED`` repeats the bounds in
pyproject.toml; raise one only once the contract tests pass on the new release.

Importing this module imports no model, reads no setting and installs no Twisted reactor:
``chatsite/asgi.py`` and ``chatsite/server.py`` import it before Django is set up. Daphne and
Twisted are imported inside the functions that need them (importing ``daphne.server`` installs
Twisted's asyncio reactor).
"""

import asyncio
import fcntl
import socket
import struct
import sys
import termios
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from channels.consumer import get_handler_name
from django.middleware.csrf import CsrfViewMiddleware

if TYPE_CHECKING:
    from daphne.cli import CommandLineInterface
    from daphne.http_protocol import WebRequest
    from daphne.server import Server

#: The releases every access below was checked against.
CHECKED_AGAINST: dict[str, str] = {
    "django": "6.1.3",
    "daphne": "4.2.3",
    "twisted": "26.10.0",
    "channels": "4.3.2",
    "uvicorn": "0.54.0",
    "prometheus-client": "0.26.0",
}

#: The releases the accesses are held to: the same bounds as pyproject.toml's dependencies.
SUPPORTED: tuple[str, ...] = (
    "django>=6.1,<6.2",
    "channels>=4.3,<4.4",
    "daphne>=4.2,<4.3",
    "twisted>=24.10,<27",
    "uvicorn>=0.34,<0.55",
    "prometheus-client>=0.17,<0.27",
)


# --- Twisted: a connection's write buffers -------------------------------------------------


def buffered_bytes(transport: Any) -> int:
    """Bytes a Twisted ``FileDescriptor`` transport holds in memory, not yet handed to the kernel.

    Relies on ``twisted.internet.abstract.FileDescriptor``'s private write buffers: the joined
    ``dataBuffer`` from ``offset`` on, plus the pieces queued since in ``_tempDataBuffer``
    (``_tempDataLen`` bytes).
    """
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


def writes_at_turn_end(reactor: Any) -> None:
    """Have every server connection of ``reactor`` (Twisted's asyncio reactor) send what it was
    given at the end of the event loop's turn, not after a round of ``epoll``.

    Twisted's ``FileDescriptor.write`` buffers the bytes and calls ``startWriting``, which
    registers the socket with the loop (``add_writer``, an ``epoll_ctl``); the loop's next round
    finds it writable, ``doWrite`` sends the buffer, and ``stopWriting`` takes the socket off
    again (a second ``epoll_ctl``). For a stream that is two system calls and one more round of
    the loop per frame. Here ``startWriting`` schedules the ``doWrite`` with ``call_soon``
    instead: what the turn's writes buffered still goes out in one ``send``, and only a socket
    whose kernel buffer is full waits for the loop to find it writable, as before.

    Relies on Twisted's asyncio reactor's ``_asyncioEventloop``, ``_writers`` (the sockets
    registered for writing) and ``_readOrWrite(selectable, False)`` (``doWrite``, and the
    connection dropped on what it returns, as a writable socket's callback does); on
    ``tcp.Server`` (an accepted connection) taking ``startWriting`` from ``FileDescriptor``; and
    on ``FileDescriptor``'s ``disconnected`` and write buffers (``buffered_bytes``).
    """
    from twisted.internet import abstract, tcp

    loop = reactor._asyncioEventloop
    registered = reactor._writers
    write_when_writable = abstract.FileDescriptor.startWriting
    write_now = reactor._readOrWrite

    def flush(connection: Any) -> None:
        connection.chatsite_flush_due = False
        if connection.disconnected or connection in registered:
            return
        write_now(connection, False)
        if not connection.disconnected and buffered_bytes(connection):
            write_when_writable(connection)  # the kernel took part: the rest when it can

    def start_writing(connection: Any) -> None:
        if connection.chatsite_flush_due or connection in registered:
            return
        connection.chatsite_flush_due = True
        loop.call_soon(flush, connection)

    tcp.Server.chatsite_flush_due = False
    tcp.Server.startWriting = start_writing


# --- Daphne: the connection behind the application's ``send`` ----------------------------


def daphne_socket(send: Callable[..., Any]) -> tuple[Any, int] | None:
    """The Twisted transport and socket file descriptor of the TCP connection behind Daphne's
    ASGI ``send``; None under another server, or when the transport is not a plain socket whose
    buffers ``buffered_bytes`` can read (TLS, a test double).

    Relies on Daphne's ``Server.create_application`` handing the application
    ``send=functools.partial(self.handle_reply, protocol)``, the protocol of an HTTP request being
    its ``WebRequest`` (a ``twisted.web.http.Request``: ``.channel.transport``), on Twisted's TCP
    transports being ``FileDescriptor``s (``_tempDataLen``, see ``buffered_bytes``), and on
    ``getHandle()`` returning their socket.
    """
    for arg in getattr(send, "args", ()):
        transport = getattr(getattr(arg, "channel", None), "transport", None)
        if transport is None or not hasattr(transport, "_tempDataLen"):
            continue
        try:
            return transport, transport.getHandle().fileno()
        except Exception:  # not a plain TCP transport: no socket to ask the kernel about
            return None
    return None


# --- uvicorn: the connection behind the application's ``send`` ---------------------------


#: uvicorn's HTTP/1.1 protocols, each of whose connections carries one request at a time. (Its
#: HTTP/2 one shares a transport between streams: not one client's buffer to read or drop.)
UVICORN_HTTP1 = (
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl",
)


def uvicorn_socket(send: Callable[..., Any]) -> tuple[Any, int] | None:
    """The asyncio transport and socket file descriptor of the TCP connection behind uvicorn's
    ASGI ``send``; None under another server, over HTTP/2, TLS or a Unix socket (whose
    ``TIOCOUTQ`` counts the kernel's memory, not the bytes queued).

    Relies on uvicorn's ``RequestResponseCycle`` (of its httptools and h11 protocols alike)
    handing the application its own bound ``send`` method and keeping the connection's transport
    as ``transport``; the transport's buffer is read and bounded through asyncio's public
    ``WriteTransport`` calls (``get_write_buffer_size``, ``set_write_buffer_limits``, ``abort``).
    """
    cycle = getattr(send, "__self__", None)
    kind = type(cycle)
    if kind.__name__ != "RequestResponseCycle" or kind.__module__ not in UVICORN_HTTP1:
        return None
    transport = getattr(cycle, "transport", None)
    if transport is None or transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return transport, sock.fileno()


# --- Linux: a socket's send queue --------------------------------------------------------


def kernel_unsent(fd: int) -> int | None:
    """Bytes in the kernel's send queue of socket ``fd`` that its peer has not acknowledged yet;
    None when the socket is closed.

    Relies on Linux's ``TIOCOUTQ`` (``SIOCOUTQ``) ioctl on a TCP socket.
    """
    try:
        packed = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return None
    return int(struct.unpack("i", packed)[0])


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


# --- Daphne: requests still arriving -----------------------------------------------------


def requests_arriving(server: "Server") -> list[tuple["WebRequest", float]]:
    """The HTTP requests on ``server`` still being received (headers or body not all in), each
    with when it began (``time.time()``), for a server still connected to their clients.

    Relies on Daphne's ``Server.connections``: ``{protocol: {"connected": t, "disconnected": t,
    ...}}``, a ``WebRequest`` adding itself from its ``__init__`` (Twisted builds it at the
    request's first line) and ``"disconnected"`` set once its client is gone; and on
    ``WebRequest.request_start``, set by ``process()`` once the whole request has arrived.
    """
    from daphne.http_protocol import WebRequest

    return [
        (request, details["connected"])
        for request, details in list(server.connections.items())
        if isinstance(request, WebRequest)
        and not hasattr(request, "request_start")
        and "disconnected" not in details
    ]


def request_transport(request: "WebRequest") -> Any:
    """The Twisted transport of a Daphne request's connection, for writing to it directly.

    Relies on ``WebRequest`` being a ``twisted.web.http.Request`` whose ``channel`` (its
    ``HTTPChannel``) is set while the request is being received.
    """
    return request.channel.transport


# --- Daphne: the server and its command line ---------------------------------------------


def daphne_server_class(every_round: Callable[["Server"], None]) -> type["Server"]:
    """Daphne's ``Server``, calling ``every_round(server)`` at each round of its own periodic
    timeout checks (every 2 s, in the reactor's thread), before Daphne's checks; keeping the
    ports it listens on (``listening_ports``) and its HTTP connections
    (``connections_close_after_response``); and, once ``chatsite_drain()`` was called, closing
    each connection after its response (``Connection: close``), so a proxy keeps none of them.

    Relies on ``Server.timeout_checker``: ``Server.run`` schedules it 2 s after starting, and it
    reschedules itself with ``reactor.callLater(2, self.timeout_checker)``, so an override runs
    at every round; on ``Server.run`` adding ``self.listen_success`` as the callback of each
    endpoint's ``listen()`` (its result: the ``IListeningPort``); on ``create_application``
    handing the application ``functools.partial(self.handle_reply, protocol)``, looked up on the
    server when the application is created (an instance attribute set by ``chatsite_drain``
    wins), with ``protocol`` a ``WebRequest`` whose ``channel`` is Twisted's ``HTTPChannel``;
    and on ``HTTPChannel.requestDone`` closing the connection when ``persistent`` is false.
    Imports ``daphne.server``, which installs Twisted's asyncio reactor.
    """
    from daphne.server import Server

    class CheckingServer(Server):
        def timeout_checker(self) -> None:
            every_round(self)
            super().timeout_checker()

        def listen_success(self, port: Any) -> None:
            self.__dict__.setdefault("chatsite_ports", []).append(port)
            super().listen_success(port)

        def protocol_connected(self, protocol: Any) -> None:
            channel = getattr(protocol, "channel", None)
            if channel is not None:
                channels = self.__dict__.setdefault("chatsite_channels", weakref.WeakSet())
                channels.add(channel)
            super().protocol_connected(protocol)

        def chatsite_drain(self) -> None:
            """From now on every response closes its connection. Only the applications
            created from now on send through ``_reply_closing`` (their ``send`` is bound
            when they are created): no frame of an answer already streaming pays for it."""
            self.handle_reply = self._reply_closing  # type: ignore[method-assign]

        async def _reply_closing(self, protocol: Any, message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                channel = getattr(protocol, "channel", None)
                if channel is not None:
                    channel.persistent = False
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await Server.handle_reply(self, protocol, message)

    return CheckingServer


def listening_ports(server: "Server") -> list[Any]:
    """The ports a ``daphne_server_class`` server listens on (Twisted ``IListeningPort``s),
    for ``stopListening()``."""
    return list(server.__dict__.get("chatsite_ports", []))


def listener_close(port: Any) -> None:
    """Stop listening on ``port`` without resetting the connections waiting in its backlog:
    they are accepted and served first. (Closing a listening socket resets every connection
    the kernel has completed but nobody has accepted; nginx, having sent its request on one,
    would answer 502 rather than try another worker.)

    Relies on Twisted's ``tcp.Port.doRead`` accepting up to ``numberAccepts`` connections in a
    row, stopping early once ``accept`` finds none waiting, and on ``stopListening``.
    """
    if hasattr(port, "doRead") and hasattr(port, "numberAccepts"):
        port.numberAccepts = 100_000
        port.doRead()
    port.stopListening()


def connections_close_after_response(server: "Server") -> int:
    """Make every HTTP connection a ``daphne_server_class`` server knows close once its
    current response ends, or after the next one when it is between requests (a connection
    nginx keeps open between requests is not closed under it: nginx may be sending on it that
    very moment, and a question sent on a connection closing under it is lost, not retried).
    Returns how many were open.

    Relies on Daphne's ``WebRequest.__init__`` calling ``server.protocol_connected(self)`` with
    its Twisted ``HTTPChannel`` as ``channel`` (so a connection is known from its first
    request), and on ``HTTPChannel.persistent`` (see ``daphne_server_class``).
    """
    open_now = 0
    for channel in list(server.__dict__.get("chatsite_channels", ())):
        if channel.transport is None or getattr(channel.transport, "disconnected", False):
            continue
        channel.persistent = False
        open_now += 1
    return open_now


def requests_open(server: "Server") -> list["WebRequest"]:
    """The HTTP requests on ``server`` whose response has not ended and whose client is still
    there: arriving, waiting for the application, or streaming.

    Relies on Daphne's ``Server.connections`` (see ``requests_arriving``) and on
    ``WebRequest.finish`` and ``connectionLost`` both calling ``server.protocol_disconnected``,
    which sets ``"disconnected"``.
    """
    from daphne.http_protocol import WebRequest

    return [
        request
        for request, details in list(server.connections.items())
        if isinstance(request, WebRequest) and "disconnected" not in details
    ]


def on_sigterm(reactor: Any, callback: Callable[[], None]) -> None:
    """Once ``reactor`` runs, have SIGTERM call ``callback()`` in the reactor's thread instead
    of stopping the reactor at once.

    Relies on Twisted installing its own SIGTERM handler (``reactor.sigTerm``: stop) when the
    reactor starts running, before the ``callWhenRunning`` calls: the handler set here, after
    it, replaces it. ``callFromThread`` is what Twisted's own handler uses from a signal.
    """
    import signal

    def install() -> None:
        signal.signal(signal.SIGTERM, lambda signum, frame: reactor.callFromThread(callback))

    reactor.callWhenRunning(install)


def server_endpoints_map(server: "Server", change: Callable[[str], str]) -> None:
    """Replace each endpoint description ``server`` will listen on with ``change(it)``.

    Relies on ``Server.__init__`` keeping the descriptions (``tcp:port=8001:interface=...``) in
    ``server.endpoints``, which ``Server.run`` hands to Twisted's ``serverFromString``.
    """
    server.endpoints = [change(str(endpoint)) for endpoint in server.endpoints]


def daphne_command_line(server_class: type["Server"]) -> type["CommandLineInterface"]:
    """Daphne's command line (its own arguments), serving with ``server_class``.

    Relies on ``CommandLineInterface.server_class``: the class ``run()`` instantiates with the
    parsed arguments (then calls its ``run()``).
    """
    from daphne.cli import CommandLineInterface

    return type("ChatsiteCommandLine", (CommandLineInterface,), {"server_class": server_class})


# --- Twisted and Daphne: shutting down ---------------------------------------------------


def installed_reactor() -> Any | None:
    """The Twisted reactor if one is installed, else None; installs none.

    Relies on Twisted's ``installReactor`` placing the reactor in
    ``sys.modules["twisted.internet.reactor"]`` (importing that module would install the
    default reactor instead of telling whether one is there).
    """
    return sys.modules.get("twisted.internet.reactor")


def await_at_shutdown(cleanup: Callable[[], Awaitable[object]], reactor: Any | None = None) -> bool:
    """Have ``reactor`` (the installed one by default) wait for ``cleanup()`` while it shuts
    down, started just after Daphne cancels the open applications. False when there is no
    reactor: nothing was registered.

    Relies on Twisted's three-phase shutdown event: every ``"before"`` trigger is called in
    order, then the phase waits for the Deferreds they returned. A ``"during"`` Deferred is not
    waited for here: ``ReactorBase`` registers its own ``crash`` as a ``"during"`` trigger, and
    on the asyncio reactor ``crash`` stops the event loop that would run ``cleanup()``. Also
    relies on Daphne's ``Server.run`` adding ``kill_all_applications`` as a ``"before"`` trigger
    after the application was imported (so after this one), and on ``cleanup()`` running on the
    reactor's asyncio loop (``Deferred.fromFuture``), whose first step comes after that call.
    """
    reactor = reactor if reactor is not None else installed_reactor()
    if reactor is None:
        return False

    def trigger() -> object:
        from twisted.internet import defer

        return defer.Deferred.fromFuture(asyncio.ensure_future(cleanup()))

    reactor.addSystemEventTrigger("before", "shutdown", trigger)
    return True


# --- prometheus_client: what a histogram's observe updates ---------------------------------


def histogram_values(child: Any) -> tuple[list[float], Any, list[Any]]:
    """A labelled histogram's bucket bounds (the last one +Inf), the value of its sum and the
    values of its buckets, each with ``inc(amount)``: what ``Histogram.observe`` updates
    (``_upper_bounds``, ``_sum``, ``_buckets``; in multiprocess mode each value is kept in the
    process's file)."""
    return child._upper_bounds, child._sum, child._buckets
