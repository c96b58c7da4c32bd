"""chatsite's uvicorn worker writes a response's head together with the first piece of its body
(``chatsite.uvicorn_server.HeadWithBody``): a real uvicorn server on loopback with the worker's
protocol, and stock uvicorn beside it to show what the count would be without it.

The writes are counted where they leave: the server socket's data segments, from Linux's
``TCP_INFO`` (``tcpi_data_segs_out``). On loopback with ``TCP_NODELAY`` (uvloop and asyncio set
it) every write of a few hundred bytes leaves as one segment."""

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from assistant import internals
from chatsite.uvicorn_server import ChatsiteHttpTools

#: ``struct tcp_info``'s ``tcpi_data_segs_out`` (Linux 4.6 and later).
DATA_SEGS_OUT = 156

App = Callable[[Any, Any, Any], Awaitable[None]]


def data_segments_out(send: Any) -> int:
    """Data segments sent so far on the connection behind uvicorn's ``send``."""
    found = internals.uvicorn_socket(send)
    assert found is not None
    _, fd = found
    with socket.socket(fileno=fd) as sock:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        finally:
            sock.detach()  # the server's own descriptor: not closed here
    return struct.unpack_from("I", info, DATA_SEGS_OUT)[0]


async def served(protocol: type, app: App, requests: list[bytes]) -> list[bytes]:
    """Each of ``requests`` sent to a uvicorn with ``protocol`` serving ``app``, on one
    connection, after the response before it; each whole response as it arrived. A last
    request with ``Connection: close`` must see the server close the connection."""
    import uvicorn

    config = uvicorn.Config(
        app, http=protocol, lifespan="off", log_level="warning", timeout_keep_alive=60
    )
    server = uvicorn.Server(config)
    listener = socket.create_server(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    responses = []
    try:
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        for request in requests:
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            body = b""
            if b"transfer-encoding: chunked" in head and not request.startswith(b"HEAD"):
                body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
            elif b"content-length: " in head and not request.startswith(b"HEAD"):
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await asyncio.wait_for(reader.readexactly(length), 10)
            responses.append(head + body)
        if b"Connection: close" in requests[-1]:  # closed by the server after the response
            assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    finally:
        server.should_exit = True
        await serving
    return responses


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
START = {"type": "http.response.start", "status": 200, "headers": [(b"x-kind", b"stream")]}


def body(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


@pytest.mark.parametrize(("protocol", "writes"), [(HttpToolsProtocol, 2), (ChatsiteHttpTools, 1)])
async def test_a_streams_head_leaves_with_its_first_frame(protocol: type, writes: int) -> None:
    counted: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        before = data_segments_out(send)
        await send(START)
        await send(body(b"data: first\n\n"))
        counted.append(data_segments_out(send) - before)
        await asyncio.sleep(0.01)
        await send(body(b"data: last\n\n", more=False))

    (response,) = await served(protocol, app, [GET])
    assert counted == [writes]
    assert response.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-kind: stream\r\ntransfer-encoding: chunked\r\n\r\n" in response
    assert response.endswith(b"\r\nd\r\ndata: first\n\n\r\nc\r\ndata: last\n\n\r\n0\r\n\r\n")


async def test_a_head_sent_alone_still_goes_at_once() -> None:
    """An application that sends its head and then waits has the head written as the event
    loop's turn ends: the client reads it while the body has not been sent."""
    read_head = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await asyncio.wait_for(read_head.wait(), 10)
        await send(body(b"data: late\n\n", more=False))

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, http=ChatsiteHttpTools, lifespan="off"))
    listener = socket.create_server(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        read_head.set()
        rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        writer.close()
    finally:
        server.should_exit = True
        await serving
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest == b"c\r\ndata: late\n\n\r\n0\r\n\r\n"


@pytest.mark.parametrize("last", ["GET", "HEAD"])
async def test_whole_responses_head_requests_and_closing_connections(last: str) -> None:
    """A response in one body (one write in all), a HEAD request (no body: the head alone), and
    ``Connection: close`` (closed after the one write, the head's alone for HEAD), in turn on
    one connection."""
    counted: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        before = data_segments_out(send)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
        )
        await send(body(b"" if scope["method"] == "HEAD" else b"hello", more=False))
        counted.append(data_segments_out(send) - before)

    head = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
    close = f"{last} / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    responses = await served(ChatsiteHttpTools, app, [GET, head, close])
    assert counted == [1, 1, 1]
    assert [r.split(b"\r\n", 1)[0] for r in responses] == [b"HTTP/1.1 200 OK"] * 3
    assert responses[0].endswith(b"\r\n\r\nhello")
    assert responses[1].endswith(b"content-length: 5\r\n\r\n")
    assert responses[2].endswith(b"\r\n\r\n" + (b"hello" if last == "GET" else b""))
    assert b"connection: close\r\n" in responses[2]
