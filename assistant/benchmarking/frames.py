"""The WHATWG event-stream frames a browser reads, parsed incrementally from raw bytes."""

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str
    id: str | None = None


class SSEParser:
    """An incremental WHATWG event-stream parser over raw bytes.

    ``feed`` returns the events whose frame ended (blank line) within the bytes fed so far, and
    keeps a partial line, a partial frame or a CR whose LF is still to come for the next call.
    Comments and ``retry`` are ignored; a frame without ``data`` dispatches nothing. A line
    naming no field of the format is ignored too, as browsers ignore it, and the first such
    line is kept in ``stray`` (bytes a layer put in the stream: ``manage.py ttft_doctor``).
    """

    def __init__(self) -> None:
        self._pending = b""
        self._after_cr = False
        self._event = ""
        self._data: list[str] = []
        self._last_id: str | None = None
        self.stray: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        buffer = self._pending + chunk
        if self._after_cr and buffer[:1] == b"\n":
            buffer = buffer[1:]  # the LF of a CRLF split across reads
        self._after_cr = False
        events: list[SSEEvent] = []
        start = 0
        for match in _LINE_END.finditer(buffer):
            line, start = buffer[start : match.start()], match.end()
            # Lines are decoded whole, so a character split across reads is never cut.
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        self._after_cr = buffer[start - 1 : start] == b"\r" and start == len(buffer)
        self._pending = buffer[start:]
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            data, event, self._data, self._event = self._data, self._event, [], ""
            return SSEEvent(event or "message", "\n".join(data), self._last_id) if data else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name != "retry" and self.stray is None:
            self.stray = line[:80]
        return None
