"""Server-side stage timings of one stream, on the monotonic clock."""

import time
from dataclasses import dataclass


def now() -> float:
    return time.monotonic()


@dataclass(slots=True)
class StreamTimings:
    """Monotonic timestamps (seconds) of each stage; 0.0 means "did not happen"."""

    received: float
    parsed: float = 0.0
    engine_submitted: float = 0.0
    engine_first_delta: float = 0.0
    first_token_sent: float = 0.0
    finished: float = 0.0
    last_token_sent: float = 0.0
    tokens: int = 0
    gap_total: float = 0.0
    gap_max: float = 0.0

    def token_sent(self, at: float) -> None:
        if self.tokens == 0:
            self.first_token_sent = at
        else:
            gap = at - self.last_token_sent
            self.gap_total += gap
            self.gap_max = max(self.gap_max, gap)
        self.last_token_sent = at
        self.tokens += 1

    def _since_received(self, stamp: float) -> float | None:
        return round((stamp - self.received) * 1000, 3) if stamp else None

    def as_ms(self) -> dict[str, float | int | None]:
        """Each stage in milliseconds since the request was received, plus derived figures."""
        engine_ttft = (
            round((self.engine_first_delta - self.engine_submitted) * 1000, 3)
            if self.engine_first_delta and self.engine_submitted
            else None
        )
        gaps = self.tokens - 1
        return {
            "parsed": self._since_received(self.parsed),
            "engine_submitted": self._since_received(self.engine_submitted),
            "engine_first_token": self._since_received(self.engine_first_delta),
            "first_token_sent": self._since_received(self.first_token_sent),
            "finished": self._since_received(self.finished),
            "engine_ttft": engine_ttft,
            "server_ttft": self._since_received(self.first_token_sent),
            "inter_token_mean": round(self.gap_total / gaps * 1000, 3) if gaps > 0 else None,
            "inter_token_max": round(self.gap_max * 1000, 3) if gaps > 0 else None,
            "tokens": self.tokens,
        }
