"""Contracts with other projects' internals: one test for each access in ``assistant.internals``,
against the installed releases of Daphne, Twisted, Django and Channels. When an upgrade changes
one of them, its test fails by name, before a stream misbehaves in production.

- The installed releases lie within ``internals.SUPPORTED``, the same bounds as pyproject.toml.
- Twisted: ``buffered_bytes`` (a transport's private write buffers), ``installed_reactor``;
  ``writes_at_turn_end`` (its asyncio reactor's writers), in a real process over loopback.
- Linux: ``kernel_unsent`` (``TIOCOUTQ``).
- Daphne, on a real ``Server``/``HTTPFactory``/``WebRequest`` over a loopback TCP connection:
  ``daphne_socket`` (the connection behind ``send``), ``requests_arriving``,
  ``requests_open`` and ``request_transport`` (its connection bookkeeping),
  ``daphne_server_class`` (its periodic timeout check, its listening ports, a draining
  server's ``Connection: close``), ``daphne_command_line`` (its CLI's ``server_class``),
  ``await_at_shutdown`` (its shutdown order).
- Twisted: ``on_sigterm`` (its SIGTERM handler, replaced once the reactor runs), in a real
  process; ``listener_close`` (``tcp.Port``'s accept loop, over a real listening socket).
- Django: ``CsrfCheck`` (``CsrfViewMiddleware._reject``).
- Channels: ``consumer_handler`` (``get_handler_name`` and ``AsyncConsumer.dispatch``), and
  what ``ChatStreamConsumer.__call__`` does in place of ``AsyncConsumer.__call__``.
- uvicorn, a real ``Server`` on loopback with each of its HTTP parsers: ``uvicorn_socket`` (the
  connection behind ``send``). And what ``chatsite/uvicorn_server.py`` overrides: the server's
  signal handler, its start-up, its wait for open requests, the httptools parser's callbacks,
  the request's cycle and its ``send`` (their behaviour: tests/assistant/test_worker_stop.py,
  test_slow_requests.py and test_uvicorn_writes.py).
"""

import asyncio
import inspect
import io
import json
import os
import re
import socket
import subprocess
import sys
import tomllib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import daphne.server
import pytest
from channels.consumer import AsyncConsumer
from channels.generic.http import AsyncHttpConsumer
from daphne.http_protocol import HTTPFactory, WebRequest
from django.core.handlers.asgi import ASGIRequest
from django.middleware.csrf import CsrfViewMiddleware
from packaging.requirements import Requirement
from twisted.internet import abstract, asyncioreactor, tcp
from twisted.internet.address import IPv4Address
from twisted.internet.base import ReactorBase
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor
from twisted.python.failure import Failure

from assistant import errors, internals
from assistant.consumers import ChatStreamConsumer
from assistant.http import csrf_error
from tests.support import StubReactor

ROOT = Path(__file__).resolve().parents[2]


# --- the releases ------------------------------------------------------------------------


def test_installed_releases_are_within_the_supported_range() -> None:
    """Each release is installed within ``SUPPORTED``, and pyproject.toml declares those bounds."""
    declared = {
        Requirement(line).name.lower(): str(Requirement(line).specifier)
        for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    for line in internals.SUPPORTED:
        supported = Requirement(line)
        installed = metadata.version(supported.name)
        assert supported.specifier.contains(installed), f"{supported.name} {installed}: {line}"
        assert declared[supported.name] == str(supported.specifier), f"pyproject.toml: {line}"
        checked = internals.CHECKED_AGAINST[supported.name]
        assert supported.specifier.contains(checked), f"checked against {checked}: {line}"
    assert set(internals.CHECKED_AGAINST) == {
        Requirement(line).name for line in internals.SUPPORTED
    }


def test_importing_internals_installs_no_reactor_and_reads_no_settings() -> None:
    """chatsite/server.py and chatsite/asgi.py import it before Django is set up."""
    probe = (
        "import sys; from assistant import internals; "
        "assert internals.installed_reactor() is None, 'a reactor was installed'; "
        "from django.conf import settings; assert not settings.configured, 'settings read'"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stderr


# --- Twisted: write buffers ----------------------------------------------------------------


class _OneBytePerWrite(abstract.FileDescriptor):
    """A descriptor whose socket takes one byte per write, as a slow client's would."""

    def writeSomeData(self, data: Any) -> int:
        return 1 if len(data) else 0


def test_buffered_bytes_follows_twisteds_write_buffers() -> None:
    """Bytes written count as buffered; each byte the socket takes leaves the count, whether it
    sits in Twisted's queue of pieces or in the joined buffer."""
    transport = _OneBytePerWrite(reactor=StubReactor())
    transport.connected = True

    assert internals.buffered_bytes(transport) == 0
    transport.write(b"abc")
    transport.write(b"de")
    assert internals.buffered_bytes(transport) == 5
    transport.doWrite()  # joins the queued pieces and writes one byte
    assert internals.buffered_bytes(transport) == 4
    transport.write(b"fgh")
    assert internals.buffered_bytes(transport) == 7
    for _ in range(7):
        transport.doWrite()
    assert internals.buffered_bytes(transport) == 0


#: A Twisted TCP server on its asyncio reactor over uvloop, as ``chatsite.server`` runs Daphne:
#: each connection is sent five pieces in one turn (four writes), then, once the client sends a
#: byte, ``BIG`` bytes and the end of the connection. It prints what the reactor was asked
#: during each of the two: to register the socket for writing (``addWriter``, called by every
#: ``startWriting``), and to ``send``.
_WRITES_SERVER = """
import asyncio, json, sys
import uvloop
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
from twisted.internet import asyncioreactor
asyncioreactor.install(asyncio.new_event_loop())
from twisted.internet import protocol, reactor, tcp
from assistant import internals

BIG = 1 << 20
counts = {"registered": 0, "sends": 0}
phases = {}
register, send = reactor.addWriter, tcp.Server.writeSomeData

def counted_register(writer):
    counts["registered"] += 1
    register(writer)

def counted_send(self, data):
    counts["sends"] += 1
    return send(self, data)

reactor.addWriter = counted_register
tcp.Server.writeSomeData = counted_send
if sys.argv[1] == "turn-end":
    internals.writes_at_turn_end(reactor)

class Pieces(protocol.Protocol):
    def connectionMade(self):
        for piece in (b"one ", b"two ", b"three\\n"):
            self.transport.write(piece)
        self.transport.writeSequence([b"four ", b"five\\n"])

    def dataReceived(self, data):
        phases["small"], counts["registered"], counts["sends"] = dict(counts), 0, 0
        self.transport.write(b"x" * BIG)
        self.transport.loseConnection()

    def connectionLost(self, reason):
        phases["big"] = dict(counts)
        print(json.dumps(phases), flush=True)
        reactor.stop()

port = reactor.listenTCP(0, protocol.Factory.forProtocol(Pieces), interface="127.0.0.1")
print(port.getHost().port, flush=True)
reactor.run()
"""


def _writes_counted(mode: str) -> dict[str, dict[str, int]]:
    """Run ``_WRITES_SERVER`` (``mode``: ``twisted`` as it is, ``turn-end`` with
    ``writes_at_turn_end``), read all it sends, and return what it counted."""
    server = subprocess.Popen(
        [sys.executable, "-c", _WRITES_SERVER, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.strip().isdigit(), server.communicate(timeout=30)[1]
        with socket.create_connection(("127.0.0.1", int(line)), timeout=30) as client:
            received = b""
            while len(received) < len(b"one two three\nfour five\n"):
                chunk = client.recv(4096)
                assert chunk, f"the connection ended after {received!r}"
                received += chunk
            assert received == b"one two three\nfour five\n"
            client.sendall(b"!")
            big = bytearray()
            while chunk := client.recv(1 << 16):
                big += chunk
        assert big == b"x" * (1 << 20)  # all of it, then the end of the connection
        out, err = server.communicate(timeout=30)
        assert server.returncode == 0, err
        return json.loads(out)
    finally:
        server.kill()
        server.wait()


def test_twisted_registers_the_socket_for_every_write_a_turn_makes() -> None:
    """As Twisted writes: the pieces of one turn go out in one ``send``, once the socket was
    registered with the loop for writing (what ``writes_at_turn_end`` saves)."""
    counted = _writes_counted("twisted")
    assert counted["small"]["registered"] >= 1
    assert counted["small"]["sends"] == 1


def test_writes_at_turn_end_sends_a_turns_writes_without_registering_the_socket() -> None:
    """With ``writes_at_turn_end``: the pieces of one turn still go out in one ``send``, with
    no socket registered; a write larger than one ``send`` takes waits for the loop to find
    the socket writable, and arrives whole, then the connection ends."""
    counted = _writes_counted("turn-end")
    assert counted["small"] == {"registered": 0, "sends": 1}
    assert counted["big"]["registered"] >= 1
    assert counted["big"]["sends"] >= (1 << 20) // tcp.Server.SEND_LIMIT


# --- Linux: the kernel's send queue --------------------------------------------------------


def test_kernel_unsent_counts_what_the_peer_has_not_taken(tcp_pair: Any) -> None:
    """Nothing queued on a fresh socket; bytes queued once the peer stops reading and the send
    buffer fills; None once the socket is closed."""
    sender, _reader = tcp_pair
    assert internals.kernel_unsent(sender.fileno()) == 0

    sender.setblocking(False)
    with pytest.raises(BlockingIOError):
        for _ in range(100_000):  # the reader never reads: the buffers fill
            sender.send(b"x" * 65536)
    assert (internals.kernel_unsent(sender.fileno()) or 0) > 0

    fd = os.dup(sender.fileno())
    os.close(fd)
    assert internals.kernel_unsent(fd) is None


# --- Daphne: a real server, factory and request over loopback TCP ------------------------


@dataclass
class _Daphne:
    """Daphne's object graph for one connection, driven by hand (its reactor never runs)."""

    server: daphne.server.Server
    transport: tcp.Server
    sends: list[Any] = field(default_factory=list)
    ran: asyncio.Event = field(default_factory=asyncio.Event)

    def receive(self, data: bytes) -> None:
        self.transport.protocol.dataReceived(data)


@pytest.fixture
def daphne_connection(tcp_pair: Any) -> Iterator[_Daphne]:
    accepted, _client = tcp_pair
    graph: _Daphne

    def application(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        graph.sends.append(send)
        graph.ran.set()
        return asyncio.sleep(0)

    server = daphne.server.Server(application=application, endpoints=["tcp:port=0"])
    server.connections = {}  # as Server.run starts it (run would start the reactor)
    factory = HTTPFactory(server)
    factory.reactor = Clock()  # the channel's own timeouts, never due
    channel = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    transport = tcp.Server(accepted, channel, ("127.0.0.1", 50000), None, 1, StubReactor())
    channel.makeConnection(transport)
    graph = _Daphne(server, transport)
    yield graph
    transport.connectionLost(Failure(ConnectionDone()))


HEAD = b"POST /api/chat/stream HTTP/1.1\r\nHost: testserver\r\nContent-Length: 2\r\n\r\n"


async def test_daphne_socket_finds_the_connection_behind_send(daphne_connection: _Daphne) -> None:
    """The ``send`` Daphne hands the application leads to the request's TCP transport and its
    socket."""
    daphne_connection.receive(HEAD + b"{}")
    await daphne_connection.ran.wait()
    [send] = daphne_connection.sends

    transport, fd = internals.daphne_socket(send) or (None, None)
    assert transport is daphne_connection.transport
    assert fd == daphne_connection.transport.socket.fileno()
    assert internals.daphne_socket(lambda message: None) is None


async def test_requests_arriving_follows_daphnes_connection_bookkeeping(
    daphne_connection: _Daphne,
) -> None:
    """A request is arriving from its first line until its body is in, dated when it began."""
    server = daphne_connection.server
    assert "self.connections = {}" in inspect.getsource(daphne.server.Server.run)
    assert internals.requests_arriving(server) == []

    first_line = HEAD.index(b"\r\n") + 2
    daphne_connection.receive(HEAD[:first_line])
    [(request, began)] = internals.requests_arriving(server)
    assert isinstance(request, WebRequest)
    assert began == server.connections[request]["connected"]
    daphne_connection.receive(HEAD[first_line:] + b"{")
    assert internals.requests_arriving(server) == [(request, began)]

    daphne_connection.receive(b"}")
    assert internals.requests_arriving(server) == []
    await daphne_connection.ran.wait()


def test_requests_arriving_leaves_out_a_request_whose_client_left(
    daphne_connection: _Daphne,
) -> None:
    daphne_connection.receive(HEAD)
    [(request, _began)] = internals.requests_arriving(daphne_connection.server)

    request.connectionLost(Failure(ConnectionDone()))
    assert internals.requests_arriving(daphne_connection.server) == []


def test_request_transport_is_the_connection_of_a_request_being_received(
    daphne_connection: _Daphne,
) -> None:
    daphne_connection.receive(HEAD)
    [(request, _began)] = internals.requests_arriving(daphne_connection.server)

    assert internals.request_transport(request) is daphne_connection.transport


def test_daphne_server_class_checks_at_every_round_of_daphnes_timeout_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Server.run`` starts the timeout checks, and each round reschedules the subclass's."""
    clock = Clock()
    monkeypatch.setattr(daphne.server, "reactor", clock)
    rounds: list[object] = []
    server_class = internals.daphne_server_class(rounds.append)
    server = server_class(application=None, endpoints=["tcp:port=0"])
    server.connections = {}  # as Server.run starts it (run would start the reactor)

    assert "self.timeout_checker" in inspect.getsource(daphne.server.Server.run)
    server.timeout_checker()
    assert rounds == [server]
    [again] = clock.getDelayedCalls()
    assert again.func == server.timeout_checker
    clock.advance(again.getTime())
    assert rounds == [server, server]


async def test_requests_open_from_arrival_until_the_client_is_gone(
    daphne_connection: _Daphne,
) -> None:
    """A request is open from its first line, while the application answers it, until Daphne
    marks it disconnected."""
    server = daphne_connection.server
    assert internals.requests_open(server) == []
    first_line = HEAD.index(b"\r\n") + 2
    daphne_connection.receive(HEAD[:first_line])
    [request] = internals.requests_open(server)
    daphne_connection.receive(HEAD[first_line:] + b"{}")
    await daphne_connection.ran.wait()
    assert internals.requests_open(server) == [request]
    request.connectionLost(Failure(ConnectionDone()))
    assert internals.requests_open(server) == []


def test_daphne_server_class_keeps_the_ports_it_listens_on() -> None:
    """``Server.run`` hands each endpoint's listening port to ``listen_success``."""
    run = inspect.getsource(daphne.server.Server.run)
    assert "listener.addCallback(self.listen_success)" in run
    server = internals.daphne_server_class(lambda server: None)(
        application=None, endpoints=["tcp:port=0"]
    )
    assert internals.listening_ports(server) == []

    class Port:
        def getHost(self) -> IPv4Address:
            return IPv4Address("TCP", "127.0.0.1", 8001)

    port = Port()
    server.listen_success(port)
    assert internals.listening_ports(server) == [port]
    assert server.listening_addresses == [("127.0.0.1", 8001)]  # Daphne's own still runs


def test_server_endpoints_map_changes_what_run_listens_on() -> None:
    """``Server.__init__`` keeps the endpoint descriptions in ``endpoints``; ``run`` passes each
    to ``serverFromString``."""
    assert "serverFromString(reactor, str(socket_description))" in inspect.getsource(
        daphne.server.Server.run
    )
    assert "for socket_description in self.endpoints:" in inspect.getsource(
        daphne.server.Server.run
    )
    server = daphne.server.Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"])
    internals.server_endpoints_map(server, lambda endpoint: endpoint + ":backlog=7")
    assert server.endpoints == ["tcp:port=0:interface=127.0.0.1:backlog=7"]


async def test_a_draining_server_closes_each_connection_after_its_response(
    daphne_connection: _Daphne,
) -> None:
    """Once draining, an application created since sends through the closing reply: its
    response says ``Connection: close`` and its channel is no longer persistent, so Twisted
    closes the connection when the response ends. The server knows the connection from its
    request (``protocol_connected``), and ``connections_close_after_response`` marks it too."""
    assert "partial(self.handle_reply, protocol)" in inspect.getsource(
        daphne.server.Server.create_application
    )
    server_class = internals.daphne_server_class(lambda server: None)
    daphne_connection.server.__class__ = server_class  # the same object graph, the subclass
    daphne_connection.server.chatsite_drain()
    daphne_connection.receive(HEAD + b"{}")
    await daphne_connection.ran.wait()
    [send] = daphne_connection.sends
    [request] = internals.requests_open(daphne_connection.server)
    channel = request.channel
    assert channel.persistent
    assert internals.connections_close_after_response(daphne_connection.server) == 1
    assert channel.persistent is False
    channel.persistent = True  # and the closing reply does the same for a response begun now

    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})
    assert channel.persistent is False
    transport = daphne_connection.transport  # never flushed: its reactor does not run
    written = bytes(transport.dataBuffer) + b"".join(transport._tempDataBuffer)
    assert b"\r\nconnection: close\r\n" in written.lower()


def test_on_sigterm_replaces_twisteds_stop_once_running(tmp_path: Path) -> None:
    """In a real process on the asyncio reactor: SIGTERM calls the callback (which stops the
    reactor here) instead of Twisted's own handler."""
    script = tmp_path / "sigterm.py"
    script.write_text(
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from twisted.internet import asyncioreactor\n"
        "asyncioreactor.install()\n"
        "from twisted.internet import reactor\n"
        "from assistant import internals\n"
        "def drain():\n"
        "    print('drain called', flush=True)\n"
        "    reactor.stop()\n"
        "internals.on_sigterm(reactor, drain)\n"
        "reactor.callWhenRunning(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
        "reactor.run()\n"
        "print('stopped', flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["drain", "called", "stopped"]


class _ListeningReactor(StubReactor):
    """``StubReactor`` that also runs what a port schedules for when it stops listening."""

    def callLater(self, _delay: float, function: Any, *args: Any) -> None:
        function(*args)


def test_listener_close_serves_the_backlog_before_it_stops_listening() -> None:
    """Connections the kernel completed but nobody accepted yet are accepted (a protocol built
    for each) when the port closes, not reset; a connection after that is refused."""
    from twisted.internet.protocol import Factory, Protocol

    built: list[Protocol] = []

    class Recording(Factory):
        def buildProtocol(self, addr: Any) -> Protocol:
            protocol = Protocol()
            built.append(protocol)
            return protocol

    assert "numberAccepts" in inspect.getsource(tcp.Port.doRead)
    port = tcp.Port(0, Recording(), interface="127.0.0.1", reactor=_ListeningReactor())
    port.startListening()
    number = port.getHost().port
    waiting = [socket.create_connection(("127.0.0.1", number)) for _ in range(3)]
    try:
        internals.listener_close(port)
        assert len(built) == 3
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", number), timeout=5)
    finally:
        for client in waiting:
            client.close()
        for protocol in built:
            if protocol.transport is not None:
                protocol.transport.socket.close()


async def _application(scope: Any, receive: Any, send: Any) -> None:
    """What the command line test serves (it is never called)."""


def test_daphne_command_line_serves_with_the_given_server_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Daphne's CLI builds its server from ``server_class``, with the parsed arguments."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts "." in front
    built: list[dict[str, Any]] = []

    class Recorder:
        abort_start = False

        def __init__(self, **kwargs: Any) -> None:
            built.append(kwargs)

        def run(self) -> None: ...

    command_line = internals.daphne_command_line(Recorder)  # type: ignore[arg-type]
    command_line().run(["-v", "0", "-p", "0", f"{__name__}:_application"])

    [kwargs] = built
    assert kwargs["application"] is _application
    assert kwargs["endpoints"] == ["tcp:port=0:interface=127.0.0.1"]


def test_daphne_http_direct_gives_daphne_twisteds_http_module_itself() -> None:
    """Twisted keeps ``twisted.web.http`` behind its deprecation stand-in; once called, Daphne's
    protocol reads the module itself, whose classes are the ones the stand-in gives."""
    import daphne.http_protocol
    from twisted.web import http

    proxied = daphne.http_protocol.http
    try:
        assert type(http) is not types.ModuleType  # the stand-in this goes around
        assert internals.daphne_http_direct()
        direct = daphne.http_protocol.http
        assert type(direct) is types.ModuleType
        assert (direct.Request, direct.HTTPFactory) == (http.Request, http.HTTPFactory)
        assert internals.daphne_http_direct()  # again: already the module
        assert daphne.http_protocol.http is direct
    finally:
        daphne.http_protocol.http = proxied


# --- Twisted and Daphne: shutting down -----------------------------------------------------


def test_installed_reactor_is_the_asyncio_reactor_daphne_installs() -> None:
    from twisted.internet import reactor

    assert internals.installed_reactor() is reactor
    assert isinstance(reactor, asyncioreactor.AsyncioSelectorReactor)


async def test_await_at_shutdown_waits_for_cleanup_after_daphne_cancels_requests() -> None:
    """Daphne cancels its applications in the "before shutdown" phase, which waits for the
    cleanup's Deferred; the "during" phase would not, since the reactor crashes itself there."""
    run = inspect.getsource(daphne.server.Server.run)
    assert 'addSystemEventTrigger("before", "shutdown", self.kill_all_applications)' in run
    base_init = inspect.getsource(ReactorBase.__init__)
    assert 'addSystemEventTrigger("during", "shutdown", self.crash)' in base_init

    reactor = MemoryReactor()
    cleaned: list[str] = []

    async def cleanup() -> None:
        cleaned.append("done")

    assert internals.await_at_shutdown(cleanup, reactor) is True
    [(trigger, _args, _kwargs)] = reactor.triggers["before"]["shutdown"]
    await trigger().asFuture(asyncio.get_running_loop())
    assert cleaned == ["done"]


# --- Django: CSRF ----------------------------------------------------------------------------


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


def test_response_logged_keeps_a_response_out_of_djangos_request_log(caplog: Any) -> None:
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django.utils.log import log_response

    request = RequestFactory().get("/")
    with caplog.at_level("WARNING", logger="django.request"):
        log_response("Service Unavailable: /", response=HttpResponse(status=503), request=request)
        assert len(caplog.records) == 1  # what it does unmarked
        marked = HttpResponse(status=503)
        internals.response_logged(marked)
        log_response("Service Unavailable: /", response=marked, request=request)
    assert len(caplog.records) == 1


# --- Channels: dispatch ----------------------------------------------------------------------


def test_consumer_handler_is_the_method_channels_dispatch_would_call() -> None:
    """Channels maps a message type to a method, and its stock dispatch makes the database hop
    before the handler (what an override using ``consumer_handler`` skips)."""
    consumer = AsyncHttpConsumer()

    assert internals.consumer_handler(consumer, {"type": "http.request"}) == consumer.http_request
    assert internals.consumer_handler(consumer, {"type": "http.unknown"}) is None
    dispatch = inspect.getsource(AsyncConsumer.dispatch)
    assert "get_handler_name(message)" in dispatch
    assert "aclose_old_connections()" in dispatch


def test_a_consumer_call_sets_what_the_streaming_consumer_sets() -> None:
    """``ChatStreamConsumer.__call__`` stands in for Channels' ``AsyncConsumer.__call__`` (its
    own loop, no channel layer): it sets what the stock one sets but the channel layer's, and
    Channels' HTTP consumer sends through ``self.send`` to ``self.base_send``."""
    stock = set(re.findall(r"self\.(\w+) =", inspect.getsource(AsyncConsumer.__call__)))
    ours = set(re.findall(r"self\.(\w+)", inspect.getsource(ChatStreamConsumer.__call__)))

    assert stock - {"channel_layer", "channel_name", "channel_receive"} == {"scope", "base_send"}
    assert {"scope", "base_send"} <= ours
    assert "self.base_send(" in inspect.getsource(AsyncConsumer.send)
    assert "self.send(" in inspect.getsource(AsyncHttpConsumer.send_headers)


# --- uvicorn: a real server on loopback ------------------------------------------------------


async def _uvicorn_found(parser: str, unix: Path | None = None) -> list[Any]:
    """What ``uvicorn_socket`` found behind ``send`` for one request to a real uvicorn with HTTP
    parser ``parser``, over loopback TCP (or the Unix socket ``unix``): the transport's buffer
    size and the peer of the socket found, or None."""
    import uvicorn

    found: list[Any] = []

    async def application(scope: Any, receive: Any, send: Any) -> None:
        connection = internals.uvicorn_socket(send)
        if connection is None:
            found.append(None)
        else:
            transport, fd = connection
            with socket.socket(fileno=os.dup(fd)) as server_end:
                found.append((transport.get_write_buffer_size(), server_end.getpeername()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    config = uvicorn.Config(application, http=parser, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    if unix is None:
        listener = socket.create_server(("127.0.0.1", 0))  # connections wait until it serves
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(unix))
        listener.listen()
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        if unix is None:
            reader, writer = await asyncio.open_connection(*listener.getsockname())
        else:
            reader, writer = await asyncio.open_unix_connection(str(unix))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 204")
        found.append(writer.get_extra_info("sockname"))
        writer.close()
    finally:
        server.should_exit = True
        await serving
    return found


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_uvicorn_socket_finds_the_connection_behind_send(parser: str) -> None:
    found, client_end = await _uvicorn_found(parser)
    assert found == (0, client_end)  # its buffer, and the socket the client connected to


async def test_uvicorn_socket_finds_nothing_over_a_unix_socket(tmp_path: Path) -> None:
    """``TIOCOUTQ`` on a Unix socket counts the kernel's memory, not the bytes queued."""
    found, _ = await _uvicorn_found("h11", unix=tmp_path / "uvicorn.sock")
    assert found is None


def test_uvicorn_socket_finds_nothing_behind_another_send() -> None:
    """Another server's ``send``, and uvicorn's HTTP/2 cycle (one transport for many streams)."""

    async def send(message: Any) -> None: ...

    other = type("RequestResponseCycle", (), {"send": send, "transport": None})
    other.__module__ = "uvicorn.protocols.http.zttp_h2_impl"
    assert internals.uvicorn_socket(other().send) is None
    assert internals.uvicorn_socket(send) is None


def test_uvicorn_calls_what_chatsites_worker_overrides() -> None:
    """``ChatsiteUvicorn`` replaces ``handle_exit`` (what ``capture_signals`` installs for SIGTERM
    and SIGINT), extends ``_wait_tasks_to_complete`` (awaited by ``shutdown`` under the graceful
    timeout, so code after it runs only if the drain ended in time), ``startup`` and
    ``shutdown``; ``ChatsiteHttpTools`` extends the parser's ``on_message_begin`` and
    ``on_message_complete``, and the late-request check reads ``cycle.response_started``,
    ``scope``, ``client``, ``transport``, ``pipeline`` and ``flow.read_paused``."""
    import uvicorn
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from chatsite.uvicorn_server import ChatsiteHttpTools, ChatsiteUvicorn

    assert "self.handle_exit" in inspect.getsource(uvicorn.Server.capture_signals)
    shutdown = inspect.getsource(uvicorn.Server.shutdown)
    assert "wait_for(" in shutdown and "self._wait_tasks_to_complete()" in shutdown
    assert "self.lifespan.shutdown()" in shutdown
    assert inspect.iscoroutinefunction(uvicorn.Server._wait_tasks_to_complete)
    for name in ("handle_exit", "startup", "shutdown", "_wait_tasks_to_complete"):
        assert inspect.signature(getattr(ChatsiteUvicorn, name)).parameters.keys() >= (
            inspect.signature(getattr(uvicorn.Server, name)).parameters.keys()
        ), name
    assert issubclass(ChatsiteHttpTools, HttpToolsProtocol)
    # The parser's callbacks, at the first byte of a request and at the end of its body.
    begin = inspect.getsource(HttpToolsProtocol.on_message_begin)
    assert "self.scope = " in begin and "self.headers = []" in begin
    complete = inspect.getsource(HttpToolsProtocol.on_message_complete)
    assert "self.cycle.more_body = False" in complete
    init = inspect.getsource(HttpToolsProtocol.__init__)
    for name in ("cycle", "scope", "client", "transport", "flow", "pipeline"):
        assert f"self.{name}" in init, name
    assert "self.read_paused" in inspect.getsource(FlowControl.__init__)
    assert "self.response_started" in inspect.getsource(RequestResponseCycle.__init__)
    # The open requests' tasks and connections, as the server's own shutdown reads them.
    assert "self.server_state.tasks" in shutdown and "self.server_state.connections" in shutdown


def test_uvicorn_starts_every_cycle_where_chatsites_worker_swaps_it() -> None:
    """``ChatsiteHttpTools`` makes each cycle a ``HeadWithBody`` in ``_start_asgi_task``, through
    which uvicorn starts every request's (a pipelined one's too); ``HeadWithBody`` lets the
    stock ``send`` write a head, or a body's piece, to a stand-in transport, which holds only
    while nothing is awaited before the write: only a transport that is behind is waited for."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from chatsite.uvicorn_server import HeadWithBody

    assert issubclass(HeadWithBody, RequestResponseCycle)
    headers = inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert "self._start_asgi_task(self.cycle, app)" in headers
    assert "self._start_asgi_task(cycle, app)" in inspect.getsource(
        HttpToolsProtocol.on_response_complete
    )
    send = inspect.getsource(RequestResponseCycle.send)
    assert send.count("await ") == 1 and "await self.flow.drain()" in send
    assert "if self.flow.write_paused and not self.disconnected:" in send


# --- prometheus_client ----------------------------------------------------------------------


def test_histogram_values_are_what_observe_updates() -> None:
    """``Histogram.observe`` adds to ``_sum`` and to the first of ``_buckets`` whose bound in
    ``_upper_bounds`` is at or above the amount; ``histogram_values`` hands those out."""
    from prometheus_client import CollectorRegistry, Histogram

    child = Histogram(
        "contract_seconds", "test", ["path"], buckets=(0.1, 1), registry=CollectorRegistry()
    ).labels("p")
    bounds, total, buckets = internals.histogram_values(child)
    assert bounds == [0.1, 1.0, float("inf")] and len(buckets) == 3
    child.observe(0.5)
    child.observe(0.1)
    assert total.get() == pytest.approx(0.6)
    assert [bucket.get() for bucket in buckets] == [1, 1, 0]
    total.inc(1.5)
    buckets[2].inc(2)
    samples = {(s.name, s.labels.get("le")): s.value for s in child.collect()[0].samples}
    assert samples[("contract_seconds_sum", None)] == pytest.approx(2.1)
    assert samples[("contract_seconds_bucket", "+Inf")] == 4
