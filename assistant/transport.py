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
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: Where the router leaves the connection for the serving paths.
CONNECTION_KEY = "chatsite.connection"


@dataclass(frozen=True, slots=True)
class ClientConnection:
    transport: Any
    fd: int

    def unsent(self) -> int:
        """Bytes written by the application that the client has not taken yet."""
        transport = self.transport
        buffered = len(transport.dataBuffer) - transport.offset + transport._tempDataLen
        try:
            packed = fcntl.ioctl(self.fd, termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:  # closed meanwhile
            return buffered
        return buffered + struct.unpack("i", packed)[0]

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
