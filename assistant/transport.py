"""How much of a response the client has left unread, and dropping a client that reads nothing.

Daphne applies no backpressure: every frame the application sends is written to the socket or,
once the kernel's send buffer is full, kept in Twisted's memory for as long as the client does
not read. This finds the connection behind the ASGI ``send`` callable Daphne hands the
application, so a stream can ask how many bytes are still waiting (Twisted's buffer plus the
kernel's send queue) and abort the connection of a reader that has stalled. Under another server
it finds nothing, and streams run unguarded. What it needs of Daphne's, Twisted's and Linux's
internals is in ``assistant.internals``.
"""

import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

from assistant import internals

logger = logging.getLogger(__name__)

#: Where the router leaves the connection for the serving paths.
CONNECTION_KEY = "chatsite.connection"


@dataclass(frozen=True, slots=True)
class ClientConnection:
    transport: Any
    fd: int
    #: Bytes of the stream produced but not yet written to this connection (a buffer between
    #: the answer and the response), counted as unread too.
    backlog: Callable[[], int] | None = None

    def unsent(self) -> int:
        """Bytes of the stream that the client has not taken yet."""
        buffered = internals.buffered_bytes(self.transport)
        buffered += self.backlog() if self.backlog else 0
        queued = internals.kernel_unsent(self.fd)
        return buffered if queued is None else buffered + queued  # None: closed meanwhile

    def behind(self, backlog: Callable[[], int]) -> "ClientConnection":
        """This connection, with ``backlog`` bytes waiting in front of it as well."""
        return replace(self, backlog=backlog)

    def abort(self) -> None:
        """Drop the connection now, with whatever was still buffered for it."""
        self.transport.abortConnection()


def client_connection(send: Callable[..., Any]) -> ClientConnection | None:
    """The connection behind Daphne's ``send``, or None under another server (or over TLS)."""
    found = internals.daphne_socket(send)
    if found is None:
        return None
    transport, fd = found
    return ClientConnection(transport, fd)


def scope_connection(scope: MutableMapping[str, Any]) -> ClientConnection | None:
    connection = scope.get(CONNECTION_KEY)
    return connection if isinstance(connection, ClientConnection) else None
