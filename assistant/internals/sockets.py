"""The connection behind an application's ``send``, and what its buffers hold: Twisted's and
uvicorn's transports, Linux's send queue, and Twisted's write path (see the package docstring).

Imports no Daphne or Twisted module at import time (``writes_at_turn_end`` imports Twisted's
``tcp`` when it is called, once a reactor is installed).
"""

import fcntl
import socket
import struct
import termios
from collections.abc import Callable
from typing import Any

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


#: Whether a class is, or extends, one of uvicorn's HTTP/1 cycles, by class (asked once each).
_UVICORN_CYCLES: dict[type, bool] = {}


def _uvicorn_cycle(kind: type) -> bool:
    known = _UVICORN_CYCLES.get(kind)
    if known is None:
        known = _UVICORN_CYCLES[kind] = any(
            base.__name__ == "RequestResponseCycle" and base.__module__ in UVICORN_HTTP1
            for base in kind.__mro__
        )
    return known


def uvicorn_socket(send: Callable[..., Any]) -> tuple[Any, int] | None:
    """The asyncio transport and socket file descriptor of the TCP connection behind uvicorn's
    ASGI ``send``; None under another server, over HTTP/2, TLS or a Unix socket (whose
    ``TIOCOUTQ`` counts the kernel's memory, not the bytes queued).

    Relies on uvicorn's ``RequestResponseCycle`` (of its httptools and h11 protocols alike, or
    a subclass: ``chatsite.uvicorn_server.HeadWithBody``) handing the application its own bound
    ``send`` method and keeping the connection's transport as ``transport``; the transport's
    buffer is read and bounded through asyncio's public ``WriteTransport`` calls
    (``get_write_buffer_size``, ``set_write_buffer_limits``, ``abort``).
    """
    cycle = getattr(send, "__self__", None)
    if not _uvicorn_cycle(type(cycle)):
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
