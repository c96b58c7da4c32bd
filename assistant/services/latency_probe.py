"""The latency probe's schedule and frames: pure, no I/O (``assistant/latency_probe.py`` sends
them, ``manage.py ttft_doctor`` reads them).

A probe is an event stream that touches no model: a ``hello`` frame the moment the request
arrives, saying what the worker received (the HTTP version and connection header the proxy
used, the encodings the client offered) and the app's ping interval; then ``frames`` frames
``interval_ms`` apart, the first of them after ``idle_s`` of silence instead when asked; then
``done``. Every frame carries the server's wall-clock time when it was written, so a client can
tell frames that were held back on the way (they arrive later than their send time says,
relative to the others) from frames that were sent late.
"""

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from assistant import errors
from assistant.errors import Rejected
from assistant.sse import encode_json_event

#: The bounds of a probe: at most ~2.5 minutes of one connection, a few hundred bytes.
MAX_FRAMES = 20
MAX_INTERVAL_MS = 2000
MAX_IDLE_S = 120.0


@dataclass(frozen=True, slots=True)
class ProbeSchedule:
    """What one probe sends: ``frames`` frames ``interval_ms`` apart after ``hello``, the first
    after ``idle_s`` of silence instead; with ``accel`` the app's ``X-Accel-Buffering: no``."""

    frames: int = 5
    interval_ms: int = 250
    idle_s: float = 0.0
    accel: bool = True

    def query(self) -> str:
        """The query string that asks for this schedule."""
        idle = f"{self.idle_s:g}"
        return (
            f"frames={self.frames}&interval_ms={self.interval_ms}&idle_s={idle}"
            f"&accel={int(self.accel)}"
        )


def _number(values: dict[str, list[str]], name: str, default: float, top: float) -> float:
    raw = values.get(name)
    if not raw:
        return default
    try:
        value = float(raw[-1])
    except ValueError:
        raise Rejected(errors.PROBE_INVALID) from None
    if not 0 <= value <= top:
        raise Rejected(errors.PROBE_INVALID)
    return value


def schedule_parse(query_string: bytes) -> ProbeSchedule:
    """The schedule a probe's query string asks for; 400 ``probe_invalid`` for a value that is
    not a number within its bounds (frames 0-20, interval_ms 0-2000, idle_s 0-120, accel 0/1)."""
    try:
        values = parse_qs(query_string.decode("ascii"), strict_parsing=False)
    except UnicodeDecodeError:
        raise Rejected(errors.PROBE_INVALID) from None
    default = ProbeSchedule()
    frames = _number(values, "frames", default.frames, MAX_FRAMES)
    interval_ms = _number(values, "interval_ms", default.interval_ms, MAX_INTERVAL_MS)
    idle_s = _number(values, "idle_s", default.idle_s, MAX_IDLE_S)
    accel = _number(values, "accel", 1, 1)
    if frames != int(frames) or accel not in (0, 1):
        raise Rejected(errors.PROBE_INVALID)
    return ProbeSchedule(
        frames=int(frames), interval_ms=int(interval_ms), idle_s=idle_s, accel=bool(accel)
    )


def hello_frame(
    *, http_version: str, connection: str | None, accept_encoding: str | None, ping_s: float
) -> bytes:
    """The first frame: the worker's view of the request, and when the worker wrote it."""
    return encode_json_event(
        {
            "seq": 0,
            "sent": time.time(),
            "http_version": http_version,
            "connection": connection,
            "accept_encoding": accept_encoding,
            "ping_interval_s": ping_s,
        },
        event="hello",
    )


def probe_frame(seq: int) -> bytes:
    return encode_json_event({"seq": seq, "sent": time.time()}, event="probe")


def done_frame(seq: int) -> bytes:
    return encode_json_event({"seq": seq, "sent": time.time()}, event="done")


def frame_read(event: str, data: str) -> dict[str, Any] | None:
    """A probe frame's payload as the doctor reads it (None for anything that is not one)."""
    if event not in {"hello", "probe", "done"}:
        return None
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("sent"), int | float):
        return None
    return payload
