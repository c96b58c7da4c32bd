"""The OpenAI-compatible HTTP engine (the ``openai-http`` backend), against real servers.

vLLM needs a GPU, so llama.cpp's own OpenAI-compatible server stands in for it, serving the same
SmolLM2 model. It runs one request at a time (``--interrupt_requests False`` keeps it from cutting
a running answer short when the next request comes), which makes an answer that is not aborted
upstream visible as a delay of the next one. Broken servers are small asyncio servers that write
exact bytes. Bounds on time are generous sanity checks for a busy two-core machine.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpx
import pytest

from assistant.benchmarking.ports import free_port
from assistant.engines import Delta, EngineError, EngineUnavailable, GenerationParams
from assistant.engines.openai_http import OpenAIHTTPEngine
from tests.assistant.engines.helpers import (
    GREEDY,
    SHORT,
    assert_streamed_answer,
    close_early_then_ask,
    collect,
)
from tests.support import CountingProxy, ModelServer


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    """``python -m llama_cpp.server`` with SmolLM2 on a free loopback port, for the module."""
    log = tmp_path_factory.mktemp("model-server") / "server.log"
    extra = ("--n_threads_batch", "1", "--interrupt_requests", "False")
    server = ModelServer(log, threads=1, extra=extra)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def engine(model_server: ModelServer) -> AsyncIterator[OpenAIHTTPEngine]:
    engine = OpenAIHTTPEngine(
        "test", {"BASE_URL": model_server.base_url, "MODEL": model_server.model}
    )
    yield engine
    await engine.aclose()


@pytest.mark.model
async def test_streams_a_real_answer_in_pieces(engine: OpenAIHTTPEngine) -> None:
    """A real server's answer arrives as several non-empty pieces and ends with a finish reason."""
    assert_streamed_answer(await collect(engine, SHORT, GREEDY), GREEDY.max_tokens)


@pytest.mark.model
async def test_closing_the_stream_aborts_generation_upstream(engine: OpenAIHTTPEngine) -> None:
    """Closing a 400-token answer after 3 pieces frees the server: the next request starts
    within 2.5 s instead of waiting seconds for the abandoned answer to finish."""
    received, waited = await close_early_then_ask(engine)

    assert all(d.text for d in received), received
    assert waited < 2.5, f"the next request waited {waited:.2f} s for the server"


@pytest.mark.model
async def test_sequential_requests_share_one_connection(model_server: ModelServer) -> None:
    """Two answers read to the end travel over one kept-alive TCP connection."""
    upstream_port = httpx.URL(model_server.base_url).port
    assert upstream_port is not None
    proxy = CountingProxy(upstream_port)
    params = GenerationParams(max_tokens=4, temperature=0.0)
    async with proxy.running() as port:
        engine = OpenAIHTTPEngine(
            "test", {"BASE_URL": f"http://127.0.0.1:{port}/v1", "MODEL": model_server.model}
        )
        try:
            first = await collect(engine, SHORT, params)
            second = await collect(engine, SHORT, params)
        finally:
            await engine.aclose()

    assert first[-1].finish_reason and second[-1].finish_reason, (first, second)
    assert proxy.accepted == 1


async def test_connection_refused_is_engine_unavailable_at_once() -> None:
    """Nothing listening on the port: EngineUnavailable on the first read, within 2 s."""
    engine = OpenAIHTTPEngine("test", {"BASE_URL": f"http://127.0.0.1:{free_port()}/v1"})
    started = time.monotonic()
    try:
        with pytest.raises(EngineUnavailable):
            await collect(engine, SHORT, GREEDY)
    finally:
        await engine.aclose()
    assert time.monotonic() - started < 2


Respond = Callable[[asyncio.StreamWriter], Awaitable[None]]

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
GOOD = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": null}]}\n\n'
)
GARBAGE = b'data: {"choices": [{"index": 0, "delta": \n\n'
END = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


def chunk(payload: bytes) -> bytes:
    """One piece of an HTTP/1.1 chunked body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@asynccontextmanager
async def fake_server(
    respond: Respond, bodies: list[dict[str, Any]] | None = None
) -> AsyncIterator[OpenAIHTTPEngine]:
    """An engine pointed at a loopback server that reads each request (into ``bodies``, parsed)
    and answers ``respond``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            body = await reader.readexactly(length)
            if bodies is not None:
                bodies.append(json.loads(body))
            await respond(writer)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine = OpenAIHTTPEngine("test", {"BASE_URL": f"http://127.0.0.1:{port}/v1", "MODEL": "m"})
    try:
        yield engine
    finally:
        await engine.aclose()
        server.close()
        await server.wait_closed()


async def read_until_error(engine: OpenAIHTTPEngine) -> tuple[list[Delta], EngineError]:
    received: list[Delta] = []
    with pytest.raises(EngineError) as caught:
        async with aclosing(engine.stream(SHORT, GREEDY)) as deltas:
            async for delta in deltas:
                received.append(delta)
    return received, caught.value


async def test_well_formed_stream_reads_to_done() -> None:
    """The byte-exact stream the broken servers below depart from is read without error."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(GOOD) + chunk(END) + b"0\r\n\r\n")

    async with fake_server(respond) as engine:
        deltas = await collect(engine, SHORT, GREEDY)

    assert deltas == [Delta("Hello"), Delta("", finish_reason="stop")]


async def test_malformed_chunk_mid_stream_is_bad_chunk() -> None:
    """A chunk that is not JSON after the first piece ends the stream with EngineError
    "bad_chunk" (not EngineUnavailable: the user has already seen part of the answer)."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(GOOD) + chunk(GARBAGE) + chunk(END) + b"0\r\n\r\n")

    async with fake_server(respond) as engine:
        received, error = await read_until_error(engine)

    assert received == [Delta("Hello")]
    assert error.code == "bad_chunk"
    assert not isinstance(error, EngineUnavailable)


async def test_malformed_first_chunk_is_engine_unavailable() -> None:
    """A malformed chunk before any piece of the answer is EngineUnavailable "bad_chunk"."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(GARBAGE) + chunk(END) + b"0\r\n\r\n")

    async with fake_server(respond) as engine:
        received, error = await read_until_error(engine)

    assert received == []
    assert isinstance(error, EngineUnavailable)
    assert error.code == "bad_chunk"


async def test_server_closing_mid_chunked_stream_is_upstream_closed() -> None:
    """A server that drops the connection in the middle of a chunked answer: EngineError."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(GOOD))

    async with fake_server(respond) as engine:
        received, error = await read_until_error(engine)

    assert received == [Delta("Hello")]
    assert error.code == "upstream_closed"
    assert not isinstance(error, EngineUnavailable)


async def test_server_closing_a_close_delimited_stream_early_is_upstream_closed() -> None:
    """A body that ends with the connection (no length, no chunks) but before [DONE] and
    before any finish reason is a broken answer, not a complete one."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            + GOOD
        )

    async with fake_server(respond) as engine:
        received, error = await read_until_error(engine)

    assert received == [Delta("Hello")]
    assert error.code == "upstream_closed"


async def test_server_closing_before_answering_is_engine_unavailable() -> None:
    """A server that reads the request and hangs up without a response: EngineUnavailable."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        pass

    async with fake_server(respond) as engine:
        received, error = await read_until_error(engine)

    assert received == []
    assert isinstance(error, EngineUnavailable)


async def test_error_status_is_engine_unavailable_with_the_status() -> None:
    """A 500 answer is EngineUnavailable on the first read, naming the status and the body."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        body = b'{"error": "overloaded"}'
        writer.write(
            b"HTTP/1.1 500 Internal Server Error\r\n"
            b"content-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )

    async with fake_server(respond) as engine:
        received, error = await read_until_error(engine)

    assert received == []
    assert isinstance(error, EngineUnavailable)
    assert "500" in str(error)
    assert "overloaded" in str(error)


async def test_sampling_settings_reach_the_model_server() -> None:
    """The request carries the alias's sampling (OpenAI's fields and vLLM's repetition_penalty);
    a neutral value is left out, for the served model's own generation config to decide."""

    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(GOOD) + chunk(END) + b"0\r\n\r\n")

    bodies: list[dict[str, Any]] = []
    params = GenerationParams(
        max_tokens=9, temperature=0.2, top_p=0.8, repeat_penalty=1.2, frequency_penalty=0.4
    )
    async with fake_server(respond, bodies) as engine:
        await collect(engine, SHORT, params)
        await collect(engine, SHORT, GenerationParams(max_tokens=3))

    sent = {k: bodies[0][k] for k in ("max_tokens", "temperature", "top_p", "frequency_penalty")}
    assert sent == {"max_tokens": 9, "temperature": 0.2, "top_p": 0.8, "frequency_penalty": 0.4}
    assert bodies[0]["repetition_penalty"] == 1.2
    assert "presence_penalty" not in bodies[0]
    assert not {"top_p", "repetition_penalty", "frequency_penalty"} & set(bodies[1])
