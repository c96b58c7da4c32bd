"""Daphne's server: its requests, its listening ports and connections, its command line, and
Twisted's reactor at shutdown (see the package docstring).

Daphne and Twisted are imported inside the functions that need them: importing ``daphne.server``
installs Twisted's asyncio reactor.
"""

import asyncio
import sys
import types
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daphne.cli import CommandLineInterface
    from daphne.http_protocol import WebRequest
    from daphne.server import Server


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
    each connection after its response (``Connection: close``), so a proxy keeps none of them;
    and leaving every POST's body to the application (Twisted does not parse it as a form).

    Relies on ``Server.timeout_checker``: ``Server.run`` schedules it 2 s after starting, and it
    reschedules itself with ``reactor.callLater(2, self.timeout_checker)``, so an override runs
    at every round; on ``Server.run`` adding ``self.listen_success`` as the callback of each
    endpoint's ``listen()`` (its result: the ``IListeningPort``); on ``create_application``
    handing the application ``functools.partial(self.handle_reply, protocol)``, looked up on the
    server when the application is created (an instance attribute set by ``chatsite_drain``
    wins), with ``protocol`` a ``WebRequest`` whose ``channel`` is Twisted's ``HTTPChannel``;
    on ``HTTPChannel.requestDone`` closing the connection when ``persistent`` is false; and on
    ``twisted.web.http.Request`` (whose ``__init__`` runs before Daphne's ``protocol_connected``)
    parsing a POST's body as a form only while ``_parsePOSTFormSubmission`` is true.
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
                # Twisted would parse the body of every POST as a form (its Content-Type
                # through the email package, 45 us, and a multipart body whole) into
                # ``args``, which Daphne never reads, and answer a body it cannot parse with
                # a bare 400 of its own before the application sees it.
                protocol._parsePOSTFormSubmission = False
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


def daphne_http_direct() -> bool:
    """Have Daphne's HTTP protocol reach ``twisted.web.http`` itself, not the stand-in Twisted
    leaves in ``sys.modules`` to warn about its deprecated names, which costs 1.9 us for each
    name read through it: Daphne reads ``http.Request`` for every body message it writes. True
    when Daphne's ``http`` is the module itself now.

    Relies on Twisted's ``deprecatedModuleAttribute`` putting a ``_ModuleProxy`` in the module's
    place that keeps the module as ``_module`` (the names it warns about, ``HTTPClient``, are
    not ones Daphne reads), and on ``daphne.http_protocol`` reading Twisted's module through its
    global ``http``.
    """
    import daphne.http_protocol

    found = daphne.http_protocol.http
    # type(), not isinstance(): the stand-in answers ``__class__`` with the module's.
    if type(found) is types.ModuleType:
        return True
    try:
        module = object.__getattribute__(found, "_module")
    except AttributeError:
        return False
    if type(module) is not types.ModuleType or module.Request is not found.Request:
        return False
    daphne.http_protocol.http = module
    return True


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
