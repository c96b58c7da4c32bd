"""Redis's protocol on one connection of the event loop's (``assistant/loop_resp.py``), against the
real Redis at 127.0.0.1:6379, and against servers on loopback that answer slowly, in pieces, or
not at all."""

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import hiredis
import pytest
import redis
from redis.exceptions import ConnectionError, InvalidResponse, ResponseError

from assistant import loop_redis
from assistant.loop_resp import resp_connect
from tests.support import REDIS_URL, redis_clients_named

NAME = f"chatsite-loop-test-{os.getpid()}"


@pytest.fixture
def key() -> Iterator[str]:
    """A key of the test's own, deleted after it, in every database it was written to."""
    name = f"test-loop-resp:{uuid.uuid4().hex}"
    yield name
    for database in (0, 7):
        with redis.Redis.from_url(f"redis://127.0.0.1:6379/{database}") as client:
            client.delete(name, f"{name}:list")


async def test_a_batch_gives_each_reply_in_its_place(key: str) -> None:
    connection = await resp_connect(REDIS_URL, name=NAME)
    try:
        replies = await connection.batch(
            [
                ("SET", key, "value"),
                ("GET", key),
                ("GET", f"{key}:missing"),
                ("RPUSH", f"{key}:list", 1, 2.5, b"three"),
                ("EVALSHA", "0" * 40, 0),  # no such script: refused, and only this one
                ("LRANGE", f"{key}:list", 0, -1),
                ("INCR", key),  # not a number: refused too
            ]
        )
    finally:
        connection.close()
    assert replies[:4] == [b"OK", b"value", None, 3]
    assert isinstance(replies[4], ResponseError) and "NOSCRIPT" in str(replies[4])
    assert replies[5] == [b"1", b"2.5", b"three"]
    assert isinstance(replies[6], ResponseError)
    await connection.closed(5)


async def test_the_url_names_the_database_and_the_connection_its_client(key: str) -> None:
    connection = await resp_connect("redis://127.0.0.1:6379/7", name=NAME)
    assert [c["db"] for c in redis_clients_named(NAME)] == ["7"]
    assert await connection.batch([("SET", key, "in 7")]) == [b"OK"]
    connection.close()
    await connection.closed(5)
    with redis.Redis.from_url("redis://127.0.0.1:6379/7") as seven:
        assert seven.get(key) == b"in 7"
    with redis.Redis.from_url(REDIS_URL) as zero:
        assert zero.get(key) is None


@pytest.fixture
def redis_user() -> Iterator[tuple[str, str]]:
    """A Redis user with a password, removed after the test."""
    user, password = f"chatsite-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with redis.Redis.from_url(REDIS_URL) as client:
        client.acl_setuser(user, enabled=True, passwords=[f"+{password}"], commands=["+@all"])
        try:
            yield user, password
        finally:
            client.acl_deluser(user)


async def test_a_user_and_password_in_the_url_log_in(redis_user: tuple[str, str]) -> None:
    user, password = redis_user
    connection = await resp_connect(f"redis://{user}:{password}@127.0.0.1:6379/0", name=NAME)
    try:
        assert await connection.batch([("ACL", "WHOAMI")]) == [user.encode()]
    finally:
        connection.close()
    with pytest.raises(ConnectionError, match="refused"):
        await resp_connect(f"redis://{user}:wrong@127.0.0.1:6379/0", name=NAME)


def kill_loop_client() -> None:
    [client] = redis_clients_named(f"{loop_redis.LOOP_CLIENT_NAME}-{os.getpid()}")
    with redis.Redis.from_url(REDIS_URL) as other:
        other.client_kill_filter(_id=client["id"])


async def test_a_connection_redis_closes_is_opened_again_for_the_next_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A name of the test's own: an earlier test's loop may have left a connection open.
    monkeypatch.setattr(loop_redis, "LOOP_CLIENT_NAME", f"chatsite-loop-{uuid.uuid4().hex[:8]}")
    commands = loop_redis.LoopCommands(REDIS_URL)
    assert await commands.send("PING") == b"PONG"
    kill_loop_client()  # between batches (a restart, an idle timeout): the next is not lost
    for _ in range(1000):  # until the loop reads the socket's end, at most 10 s
        if not commands.connected:
            break
        await asyncio.sleep(0.01)
    assert not commands.connected
    assert await commands.send("PING") == b"PONG"

    waiting = commands.send("BLPOP", f"test-loop-resp:{uuid.uuid4().hex}", 5)
    await asyncio.sleep(0.2)  # the BLPOP is with Redis
    kill_loop_client()  # during a batch: that batch fails
    with pytest.raises(ConnectionError):
        await waiting
    assert not commands.connected
    assert await commands.send("PING") == b"PONG"
    assert commands.connected
    await commands.close()
    assert not commands.connected


Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def fake_redis() -> AsyncIterator[Callable[[Answer], Awaitable[str]]]:
    """A server on loopback that answers as the test says; its URL."""
    servers: list[asyncio.Server] = []

    async def serve(answer: Answer) -> str:
        async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await answer(reader, writer)
            finally:
                writer.close()

        server = await asyncio.start_server(answered, "127.0.0.1", 0)
        servers.append(server)
        return f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"

    yield serve
    for server in servers:
        server.close()
        async with asyncio.timeout(10):
            await server.wait_closed()


async def test_replies_that_come_in_pieces_are_put_together(fake_redis) -> None:
    async def in_pieces(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1000)  # CLIENT SETNAME
        writer.write(b"+OK\r\n")
        await reader.read(1000)  # the batch
        for byte in b":42\r\n*2\r\n$5\r\nhello\r\n$-1\r\n-ERR no\r\n":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.001)
        await reader.read(1000)  # until the client closes

    connection = await resp_connect(await fake_redis(in_pieces), name=NAME)
    replies = await connection.batch([("A",), ("B",), ("C",)])
    connection.close()
    assert replies[:2] == [42, [b"hello", None]]
    assert isinstance(replies[2], ResponseError) and str(replies[2]) == "ERR no"


@pytest.mark.parametrize(
    ("sent", "first"),
    [
        (b"+OK\r\n+SURPRISE\r\n", "OK"),  # the batch's reply, then one nothing asked for
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "InvalidResponse"),  # not Redis's protocol
    ],
    ids=["a reply too many", "not redis"],
)
async def test_what_is_not_a_reply_fails_the_connection(
    fake_redis, sent: bytes, first: str
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1000)
        writer.write(b"+OK\r\n")
        await reader.read(1000)
        writer.write(sent)
        await reader.read(1000)

    connection = await resp_connect(await fake_redis(answer), name=NAME)
    [found] = await asyncio.gather(connection.batch([("A",)]), return_exceptions=True)
    assert (found == [b"OK"]) if first == "OK" else isinstance(found, InvalidResponse)
    await asyncio.sleep(0.05)
    assert not connection.usable
    with pytest.raises(InvalidResponse):
        await connection.batch([("B",)])


async def test_a_redis_that_does_not_answer_fails_the_batch_in_time(
    fake_redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch the server never answers fails after ``BATCH_TIMEOUT_S`` (the callers go to a
    thread, or log it), and its connection is not used again."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1000)
        writer.write(b"+OK\r\n")
        while await reader.read(1000):
            pass

    monkeypatch.setattr(loop_redis, "BATCH_TIMEOUT_S", 0.3)
    commands = loop_redis.LoopCommands(await fake_redis(silent))
    replies = [commands.send("GET", "k"), commands.send("GET", "l")]
    found = await asyncio.gather(*replies, return_exceptions=True)
    assert [type(error) for error in found] == [TimeoutError, TimeoutError]
    assert not commands.connected
    await commands.close()


async def test_a_unix_socket_in_the_url_is_connected_to(tmp_path) -> None:
    said: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        said.append(await reader.read(1000))
        writer.write(b"+OK\r\n+OK\r\n")
        said.append(await reader.read(1000))
        writer.write(b"+PONG\r\n")
        await reader.read(1000)
        writer.close()

    path = tmp_path / "redis.sock"
    server = await asyncio.start_unix_server(answer, str(path))
    connection = await resp_connect(f"unix://{path}?db=3", name=NAME)
    assert await connection.batch([("PING",)]) == [b"PONG"]
    connection.close()
    server.close()
    assert said[0] == b"".join(
        hiredis.pack_command(c) for c in [("SELECT", 3), ("CLIENT", "SETNAME", NAME)]
    )
