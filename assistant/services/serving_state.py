"""The sticky split between two serving paths, as a value: no I/O, no imports of services.

A session is hashed into one of 10,000 buckets (as nginx's ``split_clients`` does with a
percentage); buckets below ``percent x 100`` go to the candidate. The same session therefore
always lands on the same path while the percentage is unchanged, and raising the percentage only
moves students from the baseline to the candidate, never back and forth.
"""

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from assistant import conf
from assistant.models import ServingState

BUCKETS = 10_000
#: The OpenAI-compatible API's serving path: recorded and shown apart, its engine split like a
#: student's (``services/api_answer.py``).
API_PATH = "api"
Mode = ServingState.Mode
Breaker = ServingState.Breaker


def bucket_of(key: str) -> int:
    """A stable bucket in [0, 10000) for ``key`` (the same in every process and release)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=b"chat-split").digest()
    return int.from_bytes(digest, "big") % BUCKETS


@dataclass(frozen=True, slots=True)
class Split:
    """One reading of the shared state; ``route`` decides a path without any I/O."""

    baseline: str
    candidate: str
    percent: float
    percent_source: str
    mode: str
    breaker: str
    breaker_since: datetime | None
    updated_at: datetime | None
    updated_by: str

    @property
    def effective_percent(self) -> float:
        """The share of buckets the candidate gets right now."""
        if self.mode == Mode.FORCE_BASELINE:
            return 0.0
        if self.mode == Mode.FORCE_CANDIDATE:
            return 100.0
        if self.breaker == Breaker.OPEN:
            return 0.0
        if self.breaker == Breaker.HALF_OPEN:
            return min(self.percent, settings.CHATSITE_BREAKER["HALF_OPEN_PERCENT"])
        return self.percent

    def route(self, key: str | None) -> str:
        """The path for a session key; no key (no session yet) means the baseline."""
        share = self.effective_percent
        if share >= 100:
            return self.candidate
        if key is None or share <= 0:
            return self.baseline
        return self.candidate if bucket_of(key) < share * BUCKETS / 100 else self.baseline

    def describe(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "mode": self.mode,
            "percent": self.percent,
            "percent_source": self.percent_source,
            "effective_percent": self.effective_percent,
            "breaker": self.breaker,
            "breaker_since": self.breaker_since.isoformat() if self.breaker_since else None,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
            "updated_by": self.updated_by,
        }


def split_from(state: ServingState) -> Split:
    config = settings.CHATSITE_SERVING
    from_dashboard = state.candidate_percent is not None
    return Split(
        baseline=config["BASELINE"],
        candidate=config["CANDIDATE"],
        percent=state.candidate_percent if from_dashboard else config["CANDIDATE_PERCENT"],
        percent_source="dashboard" if from_dashboard else "settings",
        mode=state.mode,
        breaker=state.breaker,
        breaker_since=state.breaker_since,
        updated_at=state.updated_at,
        updated_by=state.updated_by,
    )


def engine_alias_for(serving_path: str) -> str:
    """The engine alias that answers on ``serving_path``."""
    return conf.settings.CHATSITE_SERVING["ENGINES"][serving_path]
