"""What the doctor's checks share: a row's shape, what the probes measured, and how late a
frame was."""

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from assistant.doctor.client import ProbeRun

#: A frame that arrives this much later than its send time says, relative to the others, was
#: held back on the way (the probe sends them ``interval_ms`` = 250 ms apart).
HELD_MS = 150.0


class Verdict(StrEnum):
    PASS = "pass"
    #: Nothing held back now, but a layer is set up in a way that costs something.
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


PASS, WARN, FAIL, SKIP = Verdict.PASS, Verdict.WARN, Verdict.FAIL, Verdict.SKIP


@dataclass(frozen=True, slots=True)
class Row:
    """One check's verdict."""

    id: str
    title: str
    verdict: Verdict
    proxy: str = ""
    direct: str = ""
    #: Where the fault is: "proxy", "app" (the worker, its server or the app), "network", or
    #: "" when a probe could not measure.
    layer: str = ""
    finding: str = ""
    fix: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "verdict": str(self.verdict),
            "proxy": self.proxy,
            "direct": self.direct,
            "layer": self.layer,
            "finding": self.finding,
            "fix": self.fix,
            "figures": self.figures,
        }


@dataclass(frozen=True, slots=True)
class Probes:
    """What the doctor measured: the site's URL with the app's buffering header and without it,
    the same at ``direct_url`` (None without ``--direct``), the idle probes (None when
    skipped) and TLS's protocol."""

    proxy: ProbeRun
    proxy_bare: ProbeRun | None = None
    direct: ProbeRun | None = None
    direct_bare: ProbeRun | None = None
    idle: ProbeRun | None = None
    idle_direct: ProbeRun | None = None
    tls: bool = False
    alpn: str | None = None
    direct_url: str | None = None


def held_ms(run: ProbeRun | None) -> float | None:
    """How much later than the earliest the most delayed frame arrived, each against its send
    time: 0 when every frame came as it was sent, about the schedule's span when the frames
    were held and released together. None with fewer than two frames."""
    if run is None or len(run.frames) < 2:
        return None
    delays = [arrival.arrived - arrival.sent for arrival in run.frames]
    return (max(delays) - min(delays)) * 1000


def trouble(run: ProbeRun | None) -> str | None:
    """Why ``run`` measured nothing (it was refused, never answered, broke off or ran out of
    time), or None when it ran to its end. A cut is not trouble: the idle check measures it."""
    if run is None:
        return "not run"
    if run.status is None:
        return run.error or run.end
    if run.status != 200:
        return f"{run.status}: {run.body[:160].decode('utf-8', 'replace')}"
    if run.end == "timeout":
        return "no end within its time"
    return None


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def flagged(row: Row, layer: str, finding: str, fix: str, *, verdict: Verdict = FAIL) -> Row:
    return replace(row, verdict=verdict, layer=layer, finding=finding, fix=fix)


def unmeasured(row: Row, why: str) -> Row:
    """``row`` failed because its probe could not measure: the gate cannot say it passed."""
    return flagged(row, "", f"could not measure: {why}", "Run the doctor again; see the reach row.")
