"""The browser's own measurements of a stream, joined with the server's record.

The page reports, for every request it made (answered, stopped, timed out, or left when the tab
closed): time to first byte, to first token rendered, to done, and how long it waited. Input is
checked strictly: the request must be one of this owner's, reported once, with plausible values.
A request the student gave up on still counts, as a TTFT of at least the time waited, so that
percentiles are not biased toward the requests that survived.
"""

import math
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from assistant import errors, metrics
from assistant.errors import Rejected
from assistant.models import StreamRecord
from assistant.services.chat_request import request_id_valid
from assistant.services.traffic_sums import client_ttft_ms, spans_invalidate

#: What the page may report about how a request ended.
CLIENT_OUTCOMES = {"ok", "error", "stopped", "timeout", "abandoned"}
#: No measurement is longer than this (ms): an answer is cut off long before.
MAX_MS = 15 * 60 * 1000
MAX_TOKENS = 100_000
_FIELDS = ("ttfb_ms", "ttft_ms", "done_ms", "waited_ms", "itl_mean_ms", "itl_max_ms", "span_ms")
#: Fewer tokens than this, or sent within less than this span (ms), cannot show buffering.
BUFFERING_MIN_TOKENS = 5
BUFFERING_MIN_SPAN_MS = 50.0


@dataclass(frozen=True, slots=True)
class Beacon:
    request_id: str
    outcome: str
    ttfb_ms: float | None
    ttft_ms: float | None
    done_ms: float | None
    waited_ms: float | None
    itl_mean_ms: float | None
    itl_max_ms: float | None
    span_ms: float | None
    tokens: int | None
    burst_gaps: int | None

    @property
    def client_ttft(self) -> float:
        """Seconds to the first token, or, when none came, at least the time waited."""
        return (
            client_ttft_ms(ttft_ms=self.ttft_ms, waited_ms=self.waited_ms, done_ms=self.done_ms)
            / 1000
        )


def _number(payload: dict[str, Any], name: str) -> float | None:
    value = payload.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise Rejected(errors.BEACON_INVALID.with_message(f"{name} must be a number."))
    if not 0 <= value <= MAX_MS:
        raise Rejected(errors.BEACON_INVALID.with_message(f"{name} is out of range."))
    return float(value)


def beacon_parse(payload: Any) -> Beacon:
    """Validate a beacon body; every inconsistency is a 400 that names the field."""
    if not isinstance(payload, dict):
        raise Rejected(errors.BEACON_INVALID)
    request_id = payload.get("request_id")
    if not request_id_valid(request_id):
        raise Rejected(errors.BEACON_INVALID.with_message("request_id is missing."))
    outcome = payload.get("outcome")
    if not isinstance(outcome, str) or outcome not in CLIENT_OUTCOMES:
        raise Rejected(
            errors.BEACON_INVALID.with_message(f"outcome must be one of {sorted(CLIENT_OUTCOMES)}.")
        )
    values = {name: _number(payload, name) for name in _FIELDS}
    tokens = _count(payload, "tokens")
    burst_gaps = _count(payload, "burst_gaps")
    if burst_gaps is not None and burst_gaps >= max(tokens or 0, 1):
        raise Rejected(errors.BEACON_INVALID.with_message("burst_gaps must be below tokens."))
    ordered = [values[k] for k in ("ttfb_ms", "ttft_ms", "done_ms") if values[k] is not None]
    if ordered != sorted(ordered):
        raise Rejected(
            errors.BEACON_INVALID.with_message("Stages must be in order: ttfb, ttft, done.")
        )
    if outcome == "ok" and (values["ttft_ms"] is None and tokens):
        raise Rejected(errors.BEACON_INVALID.with_message("ttft_ms is missing."))
    if values["ttft_ms"] is None and values["waited_ms"] is None and values["done_ms"] is None:
        raise Rejected(
            errors.BEACON_INVALID.with_message("Report ttft_ms, or waited_ms when none came.")
        )
    return Beacon(
        request_id=request_id, outcome=outcome, tokens=tokens, burst_gaps=burst_gaps, **values
    )


def _count(payload: dict[str, Any], name: str) -> int | None:
    value = payload.get(name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS
    ):
        raise Rejected(errors.BEACON_INVALID.with_message(f"{name} is out of range."))
    return value


def buffering_judge(
    *,
    server_tokens: int,
    server_span_ms: float | None,
    server_burst_gaps: int | None,
    client_tokens: int | None,
    client_span_ms: float | None,
    client_burst_gaps: int | None,
) -> bool | None:
    """Did something between the server and the page hold the stream back?

    The server sent its tokens spread out, but they reached the browser together: either in a
    much shorter span, or with at least half of the gaps between them collapsed to nothing more
    than the server's own. That is the signature of a buffering proxy, gzip or a CDN. None when
    the stream was too short to tell.
    """
    if (
        server_tokens < BUFFERING_MIN_TOKENS
        or not client_tokens
        or client_tokens < BUFFERING_MIN_TOKENS
        or server_span_ms is None
        or server_span_ms < BUFFERING_MIN_SPAN_MS
        or client_span_ms is None
        or client_burst_gaps is None
    ):
        return None
    server_share = (server_burst_gaps or 0) / (server_tokens - 1)
    client_share = client_burst_gaps / (client_tokens - 1)
    return client_span_ms < server_span_ms / 2 or client_share - server_share >= 0.5


def beacon_apply(*, owner_key: str, beacon: Beacon) -> StreamRecord | None:
    """Synchronous (ORM): join ``beacon`` to its record. None while the record is not stored
    yet (the stream is still ending); raises for someone else's or an already reported one."""
    with transaction.atomic():
        record = (
            StreamRecord.objects.select_for_update()
            .filter(request_id=beacon.request_id)
            # The stream, rather than a refusal of the same request before it (nginx sent the
            # request on to another path).
            .order_by(F("message_id").asc(nulls_last=True))
            .first()
        )
        if record is None:
            return None
        if record.owner_key != owner_key:
            raise Rejected(errors.BEACON_NOT_YOURS)
        if record.client_reported_at is not None:
            raise Rejected(errors.BEACON_DUPLICATE)
        record.client_outcome = beacon.outcome
        record.client_ttfb_ms = beacon.ttfb_ms
        record.client_ttft_ms = beacon.ttft_ms
        record.client_done_ms = beacon.done_ms
        record.client_waited_ms = beacon.waited_ms
        record.client_tokens = beacon.tokens
        record.client_itl_mean_ms = beacon.itl_mean_ms
        record.client_itl_max_ms = beacon.itl_max_ms
        record.client_span_ms = beacon.span_ms
        record.client_burst_gaps = beacon.burst_gaps
        record.buffered = buffering_judge(
            server_tokens=record.tokens,
            server_span_ms=record.server_span_ms,
            server_burst_gaps=record.server_burst_gaps,
            client_tokens=beacon.tokens,
            client_span_ms=beacon.span_ms,
            client_burst_gaps=beacon.burst_gaps,
        )
        record.client_reported_at = timezone.now()
        record.save(update_fields=list(_RECORD_FIELDS))
        spans_invalidate([record.created_at], now=record.client_reported_at)
    # Under the server that streamed the answer (its record's), whichever worker the beacon
    # reached.
    ttft = metrics.child(metrics.TTFT, record.path, record.engine, "client", record.server)
    ttft.observe(beacon.client_ttft)
    return record


_RECORD_FIELDS = (
    "client_outcome",
    "client_ttfb_ms",
    "client_ttft_ms",
    "client_done_ms",
    "client_waited_ms",
    "client_tokens",
    "client_itl_mean_ms",
    "client_itl_max_ms",
    "client_span_ms",
    "client_burst_gaps",
    "buffered",
    "client_reported_at",
)
