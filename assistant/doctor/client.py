"""One latency probe read over a raw HTTP/1.1 connection, every byte's arrival timed.

A raw client, not an HTTP library: the doctor must see what a library hides or repairs (the
exact framing, a duplicated or broken ``Transfer-Encoding``, bytes that are not an event
stream, compression) and when each byte came. Each frame's arrival is stamped on this
machine's wall clock, beside the server's send time that the frame carries.
"""

import asyncio
import re
import ssl
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from assistant.benchmarking.frames import SSEParser
from assistant.services.latency_probe import ProbeSchedule, frame_read

PROBE_PATH = "/api/chat/stream/probe"
#: What a browser offers; the doctor offers the same, so that a layer that compresses does.
ACCEPT_ENCODING = "gzip, deflate, br"
_MAX_HEADER_BYTES = 64 * 1024
#: A chunk size as RFC 9112 writes it: hex digits only (no sign, prefix or underscore).
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,18}")


class FramingError(Exception):
    """The response's HTTP framing is broken."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where to probe: ``url`` is the site (through its proxy) or a worker; ``host`` is the Host
    header to send (the site's, also to a worker, whose ALLOWED_HOSTS expects it)."""

    url: str
    host: str
    authorization: str
    cafile: str | None = None
    insecure: bool = False

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "https"

    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or (443 if self.tls else 80)

    def ssl_context(self, alpn: list[str]) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.cafile)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(alpn)
        return context


@dataclass(frozen=True, slots=True)
class Arrival:
    """A probe frame: its event, the server's send time and this machine's arrival time (wall
    clock seconds), and its payload."""

    event: str
    sent: float
    arrived: float
    payload: dict[str, Any]


@dataclass(slots=True)
class ProbeRun:
    """What one probe saw. Times in ms from the request written; ``end`` is ``done`` (the
    schedule ran out), ``cut`` (the connection ended first), ``timeout``, ``refused`` (not a
    200) or ``unreachable``."""

    schedule: ProbeSchedule
    status: int | None = None
    version: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    connect_ms: float | None = None
    headers_ms: float | None = None
    first_frame_ms: float | None = None
    framing: str = ""
    framing_error: str | None = None
    stray: str | None = None
    frames: list[Arrival] = field(default_factory=list)
    end: str = "unreachable"
    #: Seconds between the last byte received and the end of the connection, when it was cut.
    silent_s: float | None = None
    error: str | None = None
    body: bytes = b""

    def header(self, name: str) -> str | None:
        values = self.header_all(name)
        return ", ".join(values) if values else None

    def header_all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]

    @property
    def hello(self) -> dict[str, Any] | None:
        return next((a.payload for a in self.frames if a.event == "hello"), None)


class _Clock:
    """Monotonic time for intervals, mapped onto the wall clock once for comparing with the
    server's send times."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self._wall = time.time() - self.start

    def ms(self) -> float:
        return (time.monotonic() - self.start) * 1000

    def wall(self) -> float:
        return self._wall + time.monotonic()


class _Body:
    """A response body as it arrives: un-chunked (validated), decompressed, parsed as SSE."""

    def __init__(self, run: ProbeRun) -> None:
        self.run = run
        encoding = (run.header("content-encoding") or "").lower()
        self._inflate = (
            zlib.decompressobj(zlib.MAX_WBITS | 32) if encoding in {"gzip", "deflate"} else None
        )
        self._readable = encoding in {"", "identity", "gzip", "deflate"}
        self._parser = SSEParser()
        self._chunked = run.framing == "chunked"
        self._pending = b""
        self._decoded = bytearray()
        self._state = "size"
        #: Bytes of the current chunk (or of a Content-Length body) still to come.
        self._left = _content_length(run) if run.framing == "length" else 0
        self.complete = run.framing == "length" and self._left == 0

    def feed(self, data: bytes, clock: _Clock) -> None:
        """Read ``data``; the frames it completes are stamped now. A framing error is raised
        after the frames before it are read."""
        broken: FramingError | None = None
        if self._chunked:
            try:
                payload = self._unchunk(data)
            except FramingError as error:
                payload, broken = self._decoded, error
        else:
            payload = data
            if self.run.framing == "length":
                payload = data[: self._left]
                self._left -= len(payload)
                self.complete = self._left == 0
        if self._inflate is not None and payload:
            try:
                payload = self._inflate.decompress(payload)
            except zlib.error as error:
                raise FramingError(f"a compressed body that cannot be read: {error}") from None
        if self._readable:
            self.run.body += payload[: 4096 - len(self.run.body)]
            for event in self._parser.feed(payload):
                frame = frame_read(event.event, event.data)
                if frame is not None:
                    self.run.frames.append(Arrival(event.event, frame["sent"], clock.wall(), frame))
            self.run.stray = self.run.stray or self._parser.stray
        if broken is not None:
            raise broken

    def _unchunk(self, data: bytes) -> bytes:
        self._pending += data
        out = self._decoded = bytearray()
        while not self.complete:
            buffer = self._pending
            if self._state == "data":
                if not buffer:
                    break
                take = buffer[: self._left]
                out += take
                self._left -= len(take)
                self._pending = buffer[len(take) :]
                if self._left == 0:
                    self._state = "crlf"
            elif self._state == "crlf":
                if len(buffer) < 2:
                    break
                if buffer[:2] != b"\r\n":
                    raise FramingError("no CRLF after a chunk's data")
                self._pending = buffer[2:]
                self._state = "size"
            else:
                line_end = buffer.find(b"\r\n")
                if line_end < 0:
                    if len(buffer) > 1024:
                        raise FramingError("a chunk size line longer than 1 KiB")
                    break
                size_text = buffer[:line_end].split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(size_text):
                    raise FramingError(f"a chunk size that is not hexadecimal: {size_text[:20]!r}")
                size = int(size_text, 16)
                self._pending = buffer[line_end + 2 :]
                # The last chunk ends the body (its trailers, if any, are not read).
                self.complete = size == 0
                self._left, self._state = size, "data"
        return bytes(out)


def _content_length(run: ProbeRun) -> int:
    """The one Content-Length ``_framing`` accepted (the same value repeated counts once)."""
    return int(run.header_all("content-length")[0])


def _framing(run: ProbeRun) -> str:
    """How the response says where its body ends; ``FramingError`` when it cannot be read."""
    encodings = [
        part.strip().lower()
        for value in run.header_all("transfer-encoding")
        for part in value.split(",")
    ]
    if encodings:
        if encodings != ["chunked"]:
            raise FramingError(f"Transfer-Encoding: {run.header('transfer-encoding')}")
        if run.header_all("content-length"):
            raise FramingError("both Transfer-Encoding and Content-Length")
        return "chunked"
    lengths = run.header_all("content-length")
    if lengths:
        if len(set(lengths)) != 1 or not _DIGITS.fullmatch(lengths[0]):
            raise FramingError(f"Content-Length: {', '.join(lengths)}")
        return "length"
    return "close"


def _head(run: ProbeRun, raw: bytes) -> None:
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    run.version = version
    try:
        run.status = int(rest.split(" ", 1)[0])
    except ValueError:
        raise FramingError(f"not an HTTP status line: {lines[0][:60]!r}") from None
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            run.headers.append((name.strip().lower(), value.strip()))


def probe_request(target: Target, schedule: ProbeSchedule, request_id: str) -> bytes:
    path = urlsplit(target.url).path.rstrip("/") + PROBE_PATH
    return (
        f"GET {path}?{schedule.query()} HTTP/1.1\r\n"
        f"Host: {target.host}\r\n"
        "Accept: text/event-stream\r\n"
        f"Accept-Encoding: {ACCEPT_ENCODING}\r\n"
        "User-Agent: chatsite-ttft-doctor\r\n"
        f"Authorization: {target.authorization}\r\n"
        f"X-Request-Id: {request_id}\r\n\r\n"
    ).encode("latin-1")


async def probe_run(
    target: Target, schedule: ProbeSchedule, *, request_id: str, timeout_s: float
) -> ProbeRun:
    """Run one probe against ``target``: connect, ask, and read until the response ends or
    ``timeout_s`` passes."""
    run = ProbeRun(schedule=schedule)
    clock = _Clock()
    host, port = target.address()
    tls = target.ssl_context(["http/1.1"]) if target.tls else None
    deadline = time.monotonic() + timeout_s
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls else None),
            timeout=min(timeout_s, 10),
        )
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        run.error = f"cannot connect to {host}:{port}: {exc}"
        return run
    run.connect_ms = clock.ms()
    sent_at = clock.ms()
    try:
        writer.write(probe_request(target, schedule, request_id))
        await writer.drain()
        await _read(run, reader, clock, sent_at, deadline)
    except FramingError as exc:
        run.framing_error = str(exc)
        run.end = "cut"
    except (OSError, ssl.SSLError) as exc:
        run.error = str(exc) or type(exc).__name__
        run.end = "cut" if run.status else "unreachable"
    finally:
        writer.close()
    return run


async def _chunk(reader: asyncio.StreamReader, deadline: float) -> bytes | None:
    """The next bytes from ``reader`` (b"" at its end), or None at the deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    try:
        return await asyncio.wait_for(reader.read(65536), timeout=left)
    except TimeoutError:
        return None


async def _read(
    run: ProbeRun, reader: asyncio.StreamReader, clock: _Clock, sent_at: float, deadline: float
) -> None:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = await _chunk(reader, deadline)
        if not data:
            run.end = "timeout" if data is None else "unreachable"
            run.error = "no response" if data is None else "closed before any response"
            return
        buffer += data
        if len(buffer) > _MAX_HEADER_BYTES:
            raise FramingError("response headers longer than 64 KiB")
    run.headers_ms = clock.ms() - sent_at
    head, _, rest = buffer.partition(b"\r\n\r\n")
    _head(run, head)
    run.framing = _framing(run)
    body = _Body(run)
    last = time.monotonic()
    data: bytes | None = rest
    while True:
        if data:
            last = time.monotonic()
            body.feed(data, clock)
            if run.first_frame_ms is None and run.frames:
                run.first_frame_ms = clock.ms() - sent_at
        if body.complete:
            break
        data = await _chunk(reader, deadline)
        if data is None:
            run.end = "timeout"
            return
        if not data:
            break
    ended = any(a.event == "done" for a in run.frames)
    if run.status != 200:
        run.end = "refused"
    elif ended and (body.complete or run.framing == "close"):
        run.end = "done"
    else:
        run.end = "cut"
        run.silent_s = time.monotonic() - last
