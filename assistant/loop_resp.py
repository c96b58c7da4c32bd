"""Redis's protocol on one connection of the event loop's: batches of commands written at once,
their replies read in C (hiredis) as they come, with nothing else around them.

``assistant/loop_redis.py`` sends every batch of the loop's commands through one of these. It
took the place of redis-py's asyncio pipeline, whose own work (the pipeline object and its
command stack, the connection pool's lock and checks, a reply read and checked per command)
cost about 300 µs of the worker's CPU a batch, and some 20 µs more a command, where this costs
the write, the reads and the futures (``benchmarks/stream_slots.py``, ``docs/performance.md``).

What a connection does, and nothing more: open (TCP, TLS for ``rediss://``, or a Unix socket, as
the URL says), say who it is (``AUTH`` when the URL has a password, ``SELECT`` its database,
``CLIENT SETNAME``), send a batch and give its replies in order. A reply Redis gave as an error
is a ``ResponseError`` in its place, the other replies stand; a connection that fails, closes or
is closed fails every batch waiting on it with ``ConnectionError``, and is not used again.
"""

import asyncio
import collections
import ssl
from collections.abc import Sequence
from typing import Any, cast

from redis.connection import parse_url
from redis.exceptions import ConnectionError, InvalidResponse, ResponseError

#: A batch's replies as they come, and the future that gets them all.
_Waiting = tuple[list[Any], int, "asyncio.Future[list[Any]]"]


class RespConnection(asyncio.Protocol):
    """One open connection to Redis (``resp_connect``). ``batch`` writes commands and gives
    their replies; batches may overlap, their replies come back in the order they were sent."""

    def __init__(self) -> None:
        import hiredis  # here: a benchmark may hide it from redis-py, which then never gets here

        self._reader = hiredis.Reader(protocolError=InvalidResponse, replyError=ResponseError)
        self._pack = hiredis.pack_command
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._lost: Exception | None = None
        self._gone = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._replies(data)
        except InvalidResponse as error:  # not Redis's protocol: nothing more can be read
            self._fail(error)

    def _replies(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        while waiting:
            reply = reader.gets()
            if reply is False:  # hiredis: no whole reply yet
                return
            replies, count, found = waiting[0]
            replies.append(reply)
            if len(replies) == count:
                waiting.popleft()
                if not found.done():  # its caller stopped waiting
                    found.set_result(replies)
        if reader.gets() is not False:
            raise InvalidResponse("Redis sent a reply nothing asked for")

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"the connection to Redis closed: {exc or 'by Redis'}"))
        if not self._gone.done():
            self._gone.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._lost is None:
            self._lost = error
        transport = self._transport
        if transport is not None:
            transport.close()
        while self._waiting:
            _, _, found = self._waiting.popleft()
            if not found.done():
                found.set_exception(error)

    @property
    def usable(self) -> bool:
        """Open, and never failed: a connection that failed is not used again."""
        return self._lost is None and self._transport is not None

    def batch(self, commands: Sequence[Sequence[Any]]) -> "asyncio.Future[list[Any]]":
        """Write ``commands`` (``("ZREM", key, member)``, ...); their replies, in order, come in
        the future (a ``ResponseError`` in place of each that Redis refused)."""
        found: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if self._lost is not None or self._transport is None:
            found.set_exception(self._lost or ConnectionError("not connected to Redis"))
            return found
        if not commands:
            found.set_result([])
            return found
        self._waiting.append(([], len(commands), found))
        pack = self._pack
        self._transport.write(b"".join([pack(tuple(command)) for command in commands]))
        return found

    def close(self) -> None:
        """Close the connection; a batch still waiting fails with ``ConnectionError``."""
        self._fail(ConnectionError("the connection to Redis was closed"))

    async def closed(self, within_s: float) -> None:
        """Wait until the socket is closed (``close``, or Redis closed it), at most
        ``within_s``."""
        await asyncio.wait({self._gone}, timeout=within_s)


async def resp_connect(url: str, *, name: str) -> RespConnection:
    """Open a connection to the Redis at ``url`` (``redis://``, ``rediss://`` or ``unix://``,
    with a user, a password and a database as redis-py reads them), named ``name`` in Redis's
    ``CLIENT LIST``. Raises ``ConnectionError`` where Redis cannot be reached or refuses it."""
    options = parse_url(url)
    loop = asyncio.get_running_loop()
    try:
        if "path" in options:
            _, connection = await loop.create_unix_connection(RespConnection, options["path"])
        else:
            secure = options.get("connection_class") is not None
            _, connection = await loop.create_connection(
                RespConnection,
                options.get("host", "localhost"),
                options.get("port", 6379),
                ssl=ssl.create_default_context() if secure else None,
            )
    except OSError as error:
        where = options.get("path") or options.get("host")
        raise ConnectionError(f"Redis at {where}: {error}") from error
    hello: list[tuple[Any, ...]] = []
    if options.get("password") is not None:
        user = options.get("username")
        hello.append(("AUTH", user, options["password"]) if user else ("AUTH", options["password"]))
    if options.get("db"):
        hello.append(("SELECT", options["db"]))
    hello.append(("CLIENT", "SETNAME", name))
    try:
        replies = await connection.batch(hello)
        refused = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if refused is not None:
            raise ConnectionError(f"Redis refused the connection: {refused}")
    except BaseException:
        connection.close()
        raise
    return connection
