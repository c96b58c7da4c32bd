"""How much of a response the client has left unread, and dropping a client that reads nothing.

Daphne applies no backpressure: every frame the application sends is written to the socket or,
once the kernel's send buffer is full, kept in Twisted's memory for as long as the client does
not read. This reaches the connection behind the ASGI ``send`` callable Daphne hands the
application (``functools.partial(server.handle_reply, protocol)``), so a stream can ask how many
bytes are still waiting (Twisted's buffer plus the kernel's send queue, ``TIOCOUTQ``) and abort
the connection of a reader that has stalled. Under another server it finds nothing, and streams
run unguarded.
"""

import fcntl
import logging
import struct
import termios
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

logger = logging.getLogger(__name__)

#: Where the router leaves the connection for the serving paths.
CONNECTION_KEY = "chatsite.connection"


def buffered_bytes(transport: Any) -> int:
    """Bytes a Twisted ``FileDescriptor`` holds in memory, not yet handed to the kernel.

    Twisted's private write buffers: ``dataBuffer`` from ``offset`` on, plus the pieces queued
    in ``_tempDataBuffer`` (``_tempDataLen`` bytes). Twisted is bounded above in pyproject.toml,
    and tests/assistant/test_contracts.py checks this against Twisted's own buffering.
    """
    return len(transport.dataBuffer) - transport.offset + transport._tempDataLen


@dataclass(frozen=True, slots=True)
class ClientConnection:
    transport: Any
    fd: int
    #: Bytes of the stream produced but not yet written to this connection (a buffer between
    #: the answer and the response), counted as unread too.
    backlog: Callable[[], int] | None = None

    def unsent(self) -> int:
        """Bytes of the stream that the client has not taken yet."""
        buffered = buffered_bytes(self.transport) + (self.backlog() if self.backlog else 0)
        try:
            packed = fcntl.ioctl(self.fd, termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:  # closed meanwhile
            return buffered
        return buffered + struct.unpack("i", packed)[0]

    def behind(self, backlog: Callable[[], int]) -> "ClientConnection":
        """This connection, with ``backlog`` bytes waiting in front of it as well."""
        return replace(self, backlog=backlog)

    def abort(self) -> None:
        """Drop the connection now, with whatever was still buffered for it."""
        self.transport.abortConnection()


def client_connection(send: Callable[..., Any]) -> ClientConnection | None:
    """The connection behind Daphne's ``send``, or None under another server."""
    for arg in getattr(send, "args", ()):
        transport = getattr(getattr(arg, "channel", None), "transport", None)
        if transport is None or not hasattr(transport, "_tempDataLen"):
            continue
        try:
            return ClientConnection(transport, transport.getHandle().fileno())
        except Exception:  # not a plain TCP transport (TLS, a test double): unguarded
            return None
    return None


def scope_connection(scope: MutableMapping[str, Any]) -> ClientConnection | None:
    connection = scope.get(CONNECTION_KEY)
    return connection if isinstance(connection, ClientConnection) else None
