"""Server-side stage timings of one stream, on the monotonic clock."""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

#: Tokens closer together than this (seconds) count as one burst.
BURST_GAP_S = 0.002


#: Where the ASGI router notes when a chat request arrived, before any path's own code runs.
RECEIVED_KEY = "chatsite.received"


def now() -> float:
    return time.monotonic()


def received_at(scope: Mapping[str, Any]) -> float:
    """When the request arrived: the router's stamp, else now."""
    stamp = scope.get(RECEIVED_KEY)
    return stamp if isinstance(stamp, float) else now()


@dataclass(slots=True)
class StreamTimings:
    """Monotonic timestamps (seconds) of each stage; 0.0 means "did not happen"."""

    received: float
    #: Wall-clock time of ``received``, for the stored record.
    received_at: datetime = field(default_factory=timezone.now)
    parsed: float = 0.0
    engine_submitted: float = 0.0
    engine_first_delta: float = 0.0
    first_token_sent: float = 0.0
    finished: float = 0.0
    last_token_sent: float = 0.0
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    #: ``as_ms()`` of the finished stream: its done frame and its record read the same figures.
    _finished_ms: dict[str, float | int | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def token_sent(self, at: float) -> None:
        if self.tokens == 0:
            self.first_token_sent = at
        else:
            self.gaps.append(at - self.last_token_sent)
        self.last_token_sent = at
        self.tokens += 1

    def burst_gaps(self) -> int:
        """Gaps between tokens sent under ``BURST_GAP_S``: tokens that left together."""
        return sum(gap < BURST_GAP_S for gap in self.gaps)

    def _since_received(self, stamp: float) -> float | None:
        return round((stamp - self.received) * 1000, 3) if stamp else None

    def _between(self, start: float, end: float) -> float | None:
        return round((end - start) * 1000, 3) if start and end else None

    def as_ms(self) -> dict[str, float | int | None]:
        """Each stage in milliseconds since the request was received, plus derived figures;
        worked out once when the stream has finished (nothing changes after that)."""
        if self._finished_ms is not None:
            return self._finished_ms
        gaps = self.gaps
        ms = {
            "parsed": self._since_received(self.parsed),
            "engine_submitted": self._since_received(self.engine_submitted),
            "engine_first_token": self._since_received(self.engine_first_delta),
            "first_token_sent": self._since_received(self.first_token_sent),
            "finished": self._since_received(self.finished),
            "queue": self._between(self.parsed, self.engine_submitted),
            "engine_ttft": self._between(self.engine_submitted, self.engine_first_delta),
            "server_ttft": self._since_received(self.first_token_sent),
            "inter_token_mean": round(sum(gaps) / len(gaps) * 1000, 3) if gaps else None,
            "inter_token_max": round(max(gaps) * 1000, 3) if gaps else None,
            "span": self._between(self.first_token_sent, self.last_token_sent),
            "tokens": self.tokens,
        }
        if self.finished:
            self._finished_ms = ms
        return ms
