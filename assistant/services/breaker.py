"""The circuit breaker over the candidate path: back to the baseline when it is worse.

Every process runs ``breaker_evaluate`` every ``EVALUATE_S`` seconds; the state row is locked
while it runs and a process that finds it evaluated moments ago does nothing, so the verdicts
are made one at a time whatever the number of workers.

* closed: the candidate gets its share. It trips (→ open) when, over the rolling window, its P95
  server TTFT exceeds ``P95_RATIO`` x the baseline's or its error rate exceeds the baseline's by
  ``ERROR_MARGIN`` — and only with ``MIN_SAMPLES`` streams on each side, so noise cannot trip it.
* open: everyone on the baseline, for ``COOLDOWN_S``; then half-open.
* half-open: a small share (``HALF_OPEN_PERCENT``) tries the candidate again. After
  ``HALF_OPEN_SAMPLES`` candidate streams it closes if healthy and opens again if not.

The candidate's figures only count streams since the last change of state, so streams from
before a trip cannot trip it again after a recovery.
"""

import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from assistant.benchmarking.stats import percentile
from assistant.models import BreakerEvent, ServingState, StreamRecord
from assistant.services.serving import serving_state_get
from assistant.services.serving_state import Breaker, Mode, split_from
from assistant.services.telemetry import SERVER_FAULTS

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PathFigures:
    path: str
    samples: int
    errors: int
    p95_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.samples if self.samples else 0.0


def path_figures(*, serving_path: str, since: datetime, until: datetime) -> PathFigures:
    """Synchronous (ORM): streams on ``serving_path`` that arrived in [since, until]."""
    rows = StreamRecord.objects.filter(
        path=serving_path, created_at__gte=since, created_at__lte=until
    )
    samples = errors = 0
    ttfts: list[float] = []
    for outcome, ttft in rows.values_list("outcome", "server_ttft_ms").iterator():
        samples += 1
        errors += outcome in SERVER_FAULTS
        if ttft is not None:
            ttfts.append(ttft)
    p95 = round(percentile(ttfts, 95), 1) if ttfts else None
    return PathFigures(path=serving_path, samples=samples, errors=errors, p95_ms=p95)


def breaker_verdict(
    *, baseline: PathFigures, candidate: PathFigures, candidate_min: int
) -> str | None:
    """Why the candidate is worse (a sentence), "" when it is not, None without enough data."""
    config = settings.CHATSITE_BREAKER
    if baseline.samples < config["MIN_SAMPLES"] or candidate.samples < candidate_min:
        return None
    margin = config["ERROR_MARGIN"]
    if candidate.error_rate > baseline.error_rate + margin:
        return (
            f"{candidate.path} failed {candidate.error_rate:.1%} of {candidate.samples} streams, "
            f"more than {baseline.path}'s {baseline.error_rate:.1%} + {margin:.0%} points"
        )
    ratio = config["P95_RATIO"]
    if candidate.p95_ms is not None and baseline.p95_ms is not None:
        if candidate.p95_ms > ratio * baseline.p95_ms:
            return (
                f"{candidate.path} P95 server TTFT {candidate.p95_ms:.1f} ms > {ratio:g} x "
                f"{baseline.path}'s {baseline.p95_ms:.1f} ms "
                f"(n={candidate.samples}/{baseline.samples})"
            )
    return ""


def _transition(
    state: ServingState,
    now: datetime,
    *,
    to: str,
    kind: str,
    message: str,
    figures: dict[str, object],
) -> BreakerEvent:
    state.breaker = to
    state.breaker_since = now
    log = logger.warning if to == Breaker.OPEN else logger.info
    log("Serving breaker %s: %s", kind, message)
    return BreakerEvent.objects.create(
        created_at=now, kind=kind, breaker=to, message=message, figures=figures
    )


def breaker_evaluate(*, now: datetime | None = None) -> BreakerEvent | None:
    """Synchronous (ORM): look at the figures and move the breaker if they say so.

    Returns the event that was logged, if the state changed.
    """
    config = settings.CHATSITE_BREAKER
    now = now or timezone.now()
    recent = timedelta(seconds=config["EVALUATE_S"] / 2)

    def idle(state: ServingState) -> bool:
        just_done = state.evaluated_at is not None and now - recent < state.evaluated_at <= now
        nothing_to_watch = state.mode != Mode.AUTO or (
            state.breaker == Breaker.CLOSED and split_from(state).percent <= 0
        )
        return just_done or nothing_to_watch

    # Looked at without a lock first: most of the time another process has just evaluated, or
    # no candidate traffic is configured, and then nothing is locked or written.
    if idle(serving_state_get()):
        return None
    with transaction.atomic():
        state = serving_state_get(for_update=True)
        if idle(state):
            return None
        state.evaluated_at = now
        event = _breaker_step(state, now)
        state.save(update_fields=["breaker", "breaker_since", "evaluated_at"])
        return event


def _breaker_step(state: ServingState, now: datetime) -> BreakerEvent | None:
    config = settings.CHATSITE_BREAKER
    split = split_from(state)
    if split.mode != Mode.AUTO:
        return None
    if state.breaker == Breaker.OPEN:
        since = state.breaker_since or now
        if now - since < timedelta(seconds=config["COOLDOWN_S"]):
            return None
        share = min(split.percent, config["HALF_OPEN_PERCENT"])
        return _transition(
            state,
            now,
            to=Breaker.HALF_OPEN,
            kind=BreakerEvent.Kind.HALF_OPEN,
            message=f"Cool-down over: {share:g}% of students try {split.candidate} again.",
            figures={"half_open_percent": share},
        )
    if split.percent <= 0:
        return None
    window_start = now - timedelta(seconds=config["WINDOW_S"])
    baseline = path_figures(serving_path=split.baseline, since=window_start, until=now)
    since_change = max(window_start, state.breaker_since or window_start)
    candidate = path_figures(serving_path=split.candidate, since=since_change, until=now)
    half_open = state.breaker == Breaker.HALF_OPEN
    verdict = breaker_verdict(
        baseline=baseline,
        candidate=candidate,
        candidate_min=config["HALF_OPEN_SAMPLES"] if half_open else config["MIN_SAMPLES"],
    )
    if verdict is None:
        return None
    figures: dict[str, object] = {
        "baseline": {**asdict(baseline), "error_rate": round(baseline.error_rate, 4)},
        "candidate": {**asdict(candidate), "error_rate": round(candidate.error_rate, 4)},
        "p95_ratio": config["P95_RATIO"],
        "error_margin": config["ERROR_MARGIN"],
    }
    if verdict:
        kind = BreakerEvent.Kind.REOPENED if half_open else BreakerEvent.Kind.TRIPPED
        message = f"All students back on {split.baseline}: {verdict}."
        return _transition(state, now, to=Breaker.OPEN, kind=kind, message=message, figures=figures)
    if half_open:
        message = (
            f"{split.candidate} healthy again over {candidate.samples} streams "
            f"(P95 {candidate.p95_ms} ms vs {baseline.p95_ms} ms): back to {split.percent:g}%."
        )
        return _transition(
            state,
            now,
            to=Breaker.CLOSED,
            kind=BreakerEvent.Kind.CLOSED,
            message=message,
            figures=figures,
        )
    return None
