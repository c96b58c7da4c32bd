"""How much of a response the client has left unread, and dropping a client that reads nothing.

Daphne applies no backpressure: every frame the application sends is written to the socket or,
once the kernel's send buffer is full, kept in Twisted's memory for as long as the client does
not read. uvicorn does: once its transport holds more than the buffer's high-water mark, its
``send`` waits until the client reads, and the answer would wait with it. This finds the
connection behind the ASGI ``send`` callable either server hands the application, so a stream
can ask how many bytes are still waiting (the server's buffer plus the kernel's send queue) and
abort the connection of a reader that has stalled; under uvicorn it also raises the transport's
high-water mark above the limit, so that the check, not a ``send`` that waits, meets a stalled
reader first. Under another server it finds nothing, and streams run unguarded. What it needs of
Daphne's, Twisted's, uvicorn's and Linux's internals is in ``assistant.internals``.
"""

import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from django.conf import settings

from assistant import internals

logger = logging.getLogger(__name__)

#: Where the router leaves the connection for the serving paths.
CONNECTION_KEY = "chatsite.connection"


@dataclass(frozen=True, slots=True)
class ClientConnection:
    #: Bytes the server holds in memory for this connection, not yet handed to the kernel.
    buffered: Callable[[], int]
    #: Drops the connection now, with whatever is still buffered for it.
    abort: Callable[[], None]
    fd: int
    #: Bytes of the stream produced but not yet written to this connection (a buffer between
    #: the answer and the response), counted as unread too.
    backlog: Callable[[], int] | None = None

    def unsent(self) -> int:
        """Bytes of the stream that the client has not taken yet."""
        buffered = self.buffered()
        buffered += self.backlog() if self.backlog else 0
        queued = internals.kernel_unsent(self.fd)
        return buffered if queued is None else buffered + queued  # None: closed meanwhile

    def behind(self, backlog: Callable[[], int]) -> "ClientConnection":
        """This connection, with ``backlog`` bytes waiting in front of it as well."""
        return replace(self, backlog=backlog)


class UnreadWatch:
    """Whether the client of ``connection`` has more than ``limit`` bytes unread, asking the
    kernel only when it could have.

    What a client has unread grows only by what is produced for it, so it is at most the last
    reading plus every byte produced since (``bound``). While that stays within half the limit,
    the client cannot be over it and nothing is asked: a client that keeps up costs one system
    call per half limit of output (128 KiB by default) instead of one per token, and one that
    stops reading is found at the same frame as when every frame asked. The other half of the
    limit covers what goes out beside the frames and is not counted here: the headers, the
    pings, and the few bytes HTTP's chunked encoding adds to each frame.
    """

    __slots__ = ("bound", "connection", "limit")

    def __init__(self, connection: ClientConnection, limit: int) -> None:
        self.connection = connection
        self.limit = limit
        #: At most what the client has unread now; unknown (asked at the first check) at first.
        self.bound = limit

    def produced(self, size: int) -> None:
        """``size`` more bytes of the stream were made for this client."""
        self.bound += size

    def over(self) -> int | None:
        """The bytes the client has unread, when more than the limit; else None."""
        if self.bound <= self.limit // 2:
            return None
        self.bound = unsent = self.connection.unsent()
        return unsent if unsent > self.limit else None


def client_connection(send: Callable[..., Any]) -> ClientConnection | None:
    """The connection behind Daphne's or uvicorn's ``send``, or None under another server (or
    over TLS)."""
    found = internals.daphne_socket(send)
    if found is not None:
        transport, fd = found
        return ClientConnection(
            partial(internals.buffered_bytes, transport), transport.abortConnection, fd
        )
    found = internals.uvicorn_socket(send)
    if found is not None:
        transport, fd = found
        limit = settings.CHATSITE_STREAM["MAX_UNSENT_BYTES"]
        # Its send waits once the buffer passes this mark: let the limit be met first.
        high = max(transport.get_write_buffer_limits()[1], 2 * limit)
        transport.set_write_buffer_limits(high=high)
        return ClientConnection(transport.get_write_buffer_size, transport.abort, fd)
    return None


def scope_connection(scope: MutableMapping[str, Any]) -> ClientConnection | None:
    connection = scope.get(CONNECTION_KEY)
    return connection if isinstance(connection, ClientConnection) else None
