"""The doctor's raw HTTP/1.1 probe client (``assistant/doctor/client.py``), against real servers.

Each server is a small asyncio server on loopback that reads the request head and then writes
exact bytes, sleeping where timing matters: the well-formed event stream the latency probe sends,
the same stream split at awkward places, compressed, framed by length or by close, and the broken
framings, stray bytes, refusals, cuts and silences the doctor must report. Bounds on time are
generous sanity checks for a busy two-core machine.
"""

import asyncio
import json
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from assistant.benchmarking.ports import free_port
from assistant.doctor.checks import held_ms
from assistant.doctor.client import ProbeRun, Target, probe_run
from assistant.services.latency_probe import (
    ProbeSchedule,
    done_frame,
    hello_frame,
    probe_frame,
)
from assistant.sse import encode_json_event

Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

REQUEST_ID = "doctor-test-1"
AUTHORIZATION = "Bearer x"
PROBE_TARGET = "/api/chat/stream/probe?frames=5&interval_ms=250&idle_s=0&accel=1"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    """One piece of an HTTP/1.1 chunked body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def hello() -> bytes:
    """The ``hello`` frame the real probe sends, stamped now."""
    return hello_frame(
        http_version="1.1", connection="close", accept_encoding="gzip, deflate, br", ping_s=15.0
    )


def frames_now() -> list[bytes]:
    """A whole probe's frames, each stamped now: hello, two probes, done."""
    return [hello(), probe_frame(1), probe_frame(2), done_frame(3)]


def chunked(frames: list[bytes]) -> bytes:
    """``frames`` as a complete chunked body, one chunk a frame, then the last chunk."""
    return b"".join(chunk(frame) for frame in frames) + LAST_CHUNK


@dataclass
class Received:
    """What the server saw: the head of each request, decoded."""

    heads: list[str] = field(default_factory=list)

    def request(self) -> tuple[str, dict[str, str]]:
        """The one request's line and its headers (names lower-cased)."""
        assert len(self.heads) == 1, self.heads
        line, *rest = self.heads[0].split("\r\n")
        headers = {}
        for header in rest:
            if header:
                name, _, value = header.partition(":")
                headers[name.strip().lower()] = value.strip()
        return line, headers


async def until_eof(reader: asyncio.StreamReader) -> None:
    """Wait for the client to close its end (what a server that stays silent does)."""
    while await reader.read(4096):
        pass


async def probe(
    respond: Respond, *, timeout_s: float = 10.0, received: Received | None = None
) -> ProbeRun:
    """``probe_run`` against a loopback server that reads the request head, then ``respond``s and
    closes."""
    tasks: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if received is not None:
                received.heads.append(head.decode("latin-1"))
            await respond(reader, writer)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    target = Target(
        url=f"http://127.0.0.1:{port}", host=f"127.0.0.1:{port}", authorization=AUTHORIZATION
    )
    try:
        return await probe_run(target, ProbeSchedule(), request_id=REQUEST_ID, timeout_s=timeout_s)
    finally:
        server.close()
        if tasks:
            # Each handler ends on its own (its last pause, or the client's close).
            await asyncio.wait(tasks, timeout=10)
        await asyncio.wait_for(server.wait_closed(), timeout=10)


def writes(*pieces: bytes, pause_s: float = 0.02) -> Respond:
    """A server that writes ``pieces`` one at a time, pausing after each."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pause_s)

    return respond


def assert_whole_probe(run: ProbeRun) -> None:
    """``run`` read the four frames of a whole probe, in order, and ended at ``done``."""
    assert [arrival.event for arrival in run.frames] == ["hello", "probe", "probe", "done"]
    assert [arrival.payload["seq"] for arrival in run.frames] == [0, 1, 2, 3]
    assert run.end == "done", run
    assert run.framing_error is None
    assert run.stray is None
    assert run.error is None


async def test_well_formed_chunked_stream_reads_every_frame() -> None:
    """The probe's own chunked stream is read to ``done``: four frames, the hello payload, no
    framing error or stray bytes; the request is the probe's GET with the browser's encodings."""
    received = Received()
    before = time.time()
    run = await probe(writes(SSE_HEAD + chunked(frames_now())), received=received)

    assert run.status == 200
    assert run.version == "HTTP/1.1"
    assert run.framing == "chunked"
    assert run.header("content-type") == "text/event-stream"
    assert_whole_probe(run)
    assert run.hello is not None
    assert run.hello["http_version"] == "1.1"
    assert run.hello["connection"] == "close"
    assert run.hello["accept_encoding"] == "gzip, deflate, br"
    assert run.hello["ping_interval_s"] == 15.0
    for arrival in run.frames:
        assert before - 1 <= arrival.sent <= arrival.arrived + 1
    assert run.headers_ms is not None and run.first_frame_ms is not None
    assert run.first_frame_ms >= run.headers_ms >= 0
    assert run.silent_s is None

    line, headers = received.request()
    assert line == f"GET {PROBE_TARGET} HTTP/1.1"
    assert headers["accept-encoding"] == "gzip, deflate, br"
    assert headers["authorization"] == AUTHORIZATION
    assert headers["accept"] == "text/event-stream"
    assert headers["x-request-id"] == REQUEST_ID
    assert headers["host"].startswith("127.0.0.1:")


async def test_pieces_split_mid_size_line_and_mid_crlf_read_the_same_frames() -> None:
    """Bytes cut inside the head's blank line, inside a chunk-size line, between a CR and its LF,
    and between a chunk's data and its CRLF still read as the same four frames."""
    frames = frames_now()
    body = chunked(frames)
    first = chunk(frames[0])
    size_line_end = first.index(b"\r\n")
    assert size_line_end >= 2  # a two-digit size, so there is a middle to cut
    second_start = len(first)
    second = chunk(frames[1])
    cuts = sorted(
        {
            1,  # inside the first size line
            size_line_end + 1,  # between that line's CR and LF
            len(first) - 2,  # the data whole, its CRLF still to come
            len(first) - 1,  # between the data's CR and LF
            second_start + 1,  # inside the second size line
            second_start + len(second) // 2,  # inside the second frame's data
            len(body) - 3,  # inside the last chunk
        }
    )
    pieces = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    head_cut = len(SSE_HEAD) - 3
    run = await probe(writes(SSE_HEAD[:head_cut], SSE_HEAD[head_cut:], *pieces))

    assert run.framing == "chunked"
    assert_whole_probe(run)


async def test_byte_at_a_time_reads_the_same_frames() -> None:
    """The whole response written one byte at a time (every possible cut) reads the same."""
    data = SSE_HEAD + chunked(frames_now())
    run = await probe(writes(*(data[i : i + 1] for i in range(len(data))), pause_s=0))

    assert run.framing == "chunked"
    assert_whole_probe(run)


async def test_chunk_extensions_are_ignored() -> None:
    """A chunk size carrying an extension (``;name=value``) is still read as its size."""
    frame = hello()
    body = b"%x;probe=1\r\n%s\r\n" % (len(frame), frame)
    rest = chunked([probe_frame(1), done_frame(2)])
    run = await probe(writes(SSE_HEAD + body + rest))

    assert run.framing_error is None
    assert [arrival.event for arrival in run.frames] == ["hello", "probe", "done"]
    assert run.end == "done"


async def test_non_hex_chunk_size_is_a_framing_error() -> None:
    """A chunk size that is not hexadecimal is reported as such, and the run is cut there, the
    frame read before it kept."""
    run = await probe(writes(SSE_HEAD + chunk(hello()), b"zz\r\nevent: probe\r\n", pause_s=0.1))

    assert run.framing_error is not None
    assert "hexadecimal" in run.framing_error
    assert "zz" in run.framing_error
    assert run.end == "cut"
    assert [arrival.event for arrival in run.frames] == ["hello"]


async def test_missing_crlf_after_chunk_data_is_a_framing_error() -> None:
    """A chunk whose data is not followed by CRLF (here the size undercounts by one) is broken
    framing, not a frame."""
    frame = hello()
    run = await probe(writes(SSE_HEAD + b"%x\r\n%s\r\n" % (len(frame) - 1, frame)))

    assert run.framing_error is not None
    assert "CRLF" in run.framing_error
    assert run.end == "cut"
    assert run.frames == []


@pytest.mark.parametrize(
    ("framing_headers", "said"),
    [
        (b"Transfer-Encoding: chunked, chunked\r\n", "Transfer-Encoding: chunked, chunked"),
        (
            b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked, chunked",
        ),
        (b"Transfer-Encoding: gzip, chunked\r\n", "Transfer-Encoding: gzip, chunked"),
        (
            b"Transfer-Encoding: chunked\r\nContent-Length: 100\r\n",
            "both Transfer-Encoding and Content-Length",
        ),
        (b"Content-Length: 10\r\nContent-Length: 20\r\n", "Content-Length: 10, 20"),
    ],
    ids=["te-twice-in-one", "te-two-headers", "te-gzip-chunked", "te-and-cl", "two-lengths"],
)
async def test_ambiguous_framing_headers_are_a_framing_error(
    framing_headers: bytes, said: str
) -> None:
    """A response whose headers do not say unambiguously where its body ends is reported with the
    headers that said it, and no frame is read from it."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + framing_headers + b"\r\n"
    run = await probe(writes(head + chunked(frames_now())))

    assert run.status == 200
    assert run.framing_error == said
    assert run.end == "cut"
    assert run.frames == []


async def test_content_length_body_is_read_to_its_length() -> None:
    """A Content-Length body holding the frames is framed by length and ends when that many bytes
    came, although the server keeps the connection open and sends more."""
    body = b"".join(frames_now())
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % (
        len(body)
    )
    extra = probe_frame(9)

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head + body + extra)
        await writer.drain()
        await until_eof(reader)

    run = await probe(respond, timeout_s=10)

    assert run.framing == "length"
    assert_whole_probe(run)
    assert run.body == body


async def test_close_delimited_body_is_read_until_close() -> None:
    """An HTTP/1.1 response with neither Transfer-Encoding nor Content-Length is framed by the
    server closing, and read to ``done``."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    run = await probe(writes(head, *frames_now()))

    assert run.framing == "close"
    assert_whole_probe(run)


async def test_gzip_chunked_stream_is_decompressed_frame_by_frame() -> None:
    """A gzip-compressed chunked stream, flushed after each frame, is read as the same frames,
    each when its flush arrives rather than at the end."""
    compressor = zlib.compressobj(wbits=31)

    def compressed(frame: bytes) -> bytes:
        return chunk(compressor.compress(frame) + compressor.flush(zlib.Z_SYNC_FLUSH))

    head = SSE_HEAD.replace(
        b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\nVary: Accept-Encoding\r\n\r\n"
    )

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head + compressed(hello()))
        await writer.drain()
        await asyncio.sleep(0.3)
        for frame in (probe_frame(1), probe_frame(2), done_frame(3)):
            writer.write(compressed(frame))
        writer.write(chunk(compressor.flush()) + LAST_CHUNK)

    run = await probe(respond)

    assert run.header("content-encoding") == "gzip"
    assert run.framing == "chunked"
    assert_whole_probe(run)
    assert run.hello is not None and run.hello["accept_encoding"] == "gzip, deflate, br"
    assert run.body.startswith(b"event: hello\n")
    assert run.frames[1].arrived - run.frames[0].arrived >= 0.2


async def test_stray_bytes_before_a_field_are_reported() -> None:
    """A line naming no event-stream field (a field name indented by three spaces) is kept as
    ``stray``; the frame it spoiled is not read as a hello."""
    spoiled = b"   " + hello()
    assert spoiled.startswith(b"   event: hello\n")
    run = await probe(writes(SSE_HEAD + chunked([spoiled, probe_frame(1), done_frame(2)])))

    assert run.stray is not None
    assert "event" in run.stray
    assert run.hello is None
    assert run.framing_error is None
    assert run.end == "done"


async def test_connection_closed_mid_stream_is_cut() -> None:
    """A chunked stream that ends after hello, without the last chunk, is ``cut``, with the
    silence before the close measured."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(hello()))
        await writer.drain()
        await asyncio.sleep(0.3)

    run = await probe(respond)

    assert run.end == "cut"
    assert [arrival.event for arrival in run.frames] == ["hello"]
    assert run.framing_error is None
    assert run.silent_s is not None
    assert 0.1 <= run.silent_s < 10


async def test_chunked_stream_ending_without_done_is_cut() -> None:
    """A chunked stream that ends cleanly (last chunk) but never sent ``done`` is still ``cut``:
    the schedule did not run out."""
    run = await probe(writes(SSE_HEAD + chunked([hello(), probe_frame(1)])))

    assert run.end == "cut"
    assert run.framing_error is None
    assert len(run.frames) == 2


async def test_unauthorized_is_refused_with_its_body() -> None:
    """A 401 JSON answer is ``refused``, its status and body kept for the report."""
    payload = json.dumps({"error": {"code": "unauthorized", "message": "bad key"}}).encode()
    head = (
        b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload)
    )
    run = await probe(writes(head + payload))

    assert run.status == 401
    assert run.end == "refused"
    assert run.body == payload
    assert json.loads(run.body)["error"]["code"] == "unauthorized"
    assert run.frames == []
    assert run.framing_error is None


async def test_nothing_listening_is_unreachable() -> None:
    """A port nothing listens on is ``unreachable`` at once, with the reason."""
    port = free_port()
    target = Target(
        url=f"http://127.0.0.1:{port}", host=f"127.0.0.1:{port}", authorization=AUTHORIZATION
    )
    run = await probe_run(target, ProbeSchedule(), request_id=REQUEST_ID, timeout_s=5)

    assert run.end == "unreachable"
    assert run.status is None
    assert run.error is not None
    assert f"127.0.0.1:{port}" in run.error
    assert run.connect_ms is None


async def test_closed_before_any_response_is_unreachable() -> None:
    """A server that reads the request and closes without a byte answered nothing."""
    run = await probe(writes())

    assert run.end == "unreachable"
    assert run.status is None
    assert run.error == "closed before any response"


async def test_silence_after_headers_is_a_timeout() -> None:
    """Headers and then nothing ends at ``timeout_s`` as ``timeout``, not as a cut."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        await writer.drain()
        await until_eof(reader)

    started = time.monotonic()
    run = await probe(respond, timeout_s=0.5)
    took = time.monotonic() - started

    assert run.status == 200
    assert run.end == "timeout"
    assert run.frames == []
    assert 0.4 <= took < 10


async def test_silence_before_headers_is_a_timeout() -> None:
    """A server that accepts and never answers ends at ``timeout_s`` with no response."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await until_eof(reader)

    run = await probe(respond, timeout_s=0.5)

    assert run.end == "timeout"
    assert run.status is None
    assert run.error == "no response"


def frame_at(event: str, seq: int, sent: float) -> bytes:
    """A probe frame stamped ``sent`` rather than now."""
    return encode_json_event({"seq": seq, "sent": sent}, event=event)


async def test_frames_released_together_are_held() -> None:
    """Frames sent 300 ms apart but written together when the second was sent show as held back
    by about 300 ms."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        t0 = time.time()
        await asyncio.sleep(0.3)
        frames = [frame_at("hello", 0, t0), frame_at("probe", 1, t0 + 0.3)]
        writer.write(SSE_HEAD + b"".join(chunk(frame) for frame in frames))
        await writer.drain()
        writer.write(chunk(frame_at("done", 2, time.time())) + LAST_CHUNK)

    run = await probe(respond)

    assert run.end == "done"
    held = held_ms(run)
    assert held is not None
    assert 200 <= held <= 1000


async def test_frames_written_as_sent_are_not_held() -> None:
    """Frames written when they are stamped, 300 ms apart, show as not held back."""

    async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(frame_at("hello", 0, time.time())))
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(chunk(frame_at("probe", 1, time.time())))
        await writer.drain()
        writer.write(chunk(frame_at("done", 2, time.time())) + LAST_CHUNK)

    run = await probe(respond)

    assert run.end == "done"
    assert run.frames[1].arrived - run.frames[0].arrived >= 0.2
    held = held_ms(run)
    assert held is not None
    assert held < 100


def test_held_needs_two_frames() -> None:
    """``held_ms`` says nothing for a run with fewer than two frames."""
    assert held_ms(None) is None
    assert held_ms(ProbeRun(schedule=ProbeSchedule())) is None


@pytest.mark.parametrize("size", [b"-1", b"0x8e", b"+8e", b"1_0", b"\xb2"])
async def test_chunk_sizes_outside_the_grammar_are_framing_errors(size: bytes) -> None:
    """Only hex digits make a chunk size: a sign, a prefix or an underscore (which Python's
    ``int(..., 16)`` would take) is a framing error, never a size (-1 once looped forever)."""
    body = chunk(hello()) + size + b"\r\nabc\r\n" + LAST_CHUNK
    run = await asyncio.wait_for(probe(writes(SSE_HEAD, body)), timeout=20)
    assert run.framing_error is not None and "hexadecimal" in run.framing_error
    assert run.end == "cut"


async def test_frames_before_a_framing_error_in_the_same_read_are_kept() -> None:
    """A good chunk and a broken one arriving in one read: the good chunk's frame is read."""
    run = await probe(writes(SSE_HEAD + chunk(hello()) + b"zz\r\nabc\r\n"))
    assert [arrival.event for arrival in run.frames] == ["hello"]
    assert run.framing_error is not None


async def test_the_same_content_length_twice_is_one_length() -> None:
    body = b"".join(frames_now())
    length = b"Content-Length: %d\r\n" % len(body)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + length * 2 + b"\r\n"
    run = await probe(writes(head + body))
    assert (run.framing, run.framing_error, run.end) == ("length", None, "done")


async def test_a_length_body_cut_short_is_cut() -> None:
    """The server promised more bytes than it sent before closing: the run was cut, even though
    the ``done`` frame came."""
    body = b"".join(frames_now())
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % (
        len(body) + 100
    )
    run = await probe(writes(head + body))
    assert run.end == "cut"


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate"])
async def test_unreadable_compressed_bodies_are_framing_errors(encoding: bytes) -> None:
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: " + encoding + b"\r\n\r\n")
    run = await probe(writes(head + chunk(b"notgzip!!!") + LAST_CHUNK))
    assert run.framing_error is not None and "compressed" in run.framing_error
