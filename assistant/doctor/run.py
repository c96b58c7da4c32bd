"""``manage.py ttft_doctor``'s work: run the probes, judge them, and write the report."""

import asyncio
import json
import ssl
import uuid
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from assistant.doctor.checks import CHECKS, diagnosis
from assistant.doctor.client import ProbeRun, Target, probe_run
from assistant.doctor.verdicts import FAIL, PASS, SKIP, Probes, Row
from assistant.services.latency_probe import MAX_IDLE_S, ProbeSchedule

#: Beyond its schedule, how long a probe may take to answer and end.
SLACK_S = 30.0
#: The idle probe's silence beyond the app's ping interval: a stream is silent for at most
#: about the interval (then a ping), so a timeout at the interval or below cuts the probe.
IDLE_MARGIN_S = 0.25
#: The app's default ping interval, for a probe whose hello could not be read.
DEFAULT_PING_S = 15.0


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    url: str
    authorization: str
    direct: str | None = None
    cafile: str | None = None
    insecure: bool = False
    skip: frozenset[str] = field(default_factory=frozenset)


def _request_id() -> str:
    return f"doctor-{uuid.uuid4().hex[:16]}"


async def _probe(target: Target, schedule: ProbeSchedule) -> ProbeRun:
    span_s = schedule.idle_s + schedule.frames * schedule.interval_ms / 1000
    return await probe_run(target, schedule, request_id=_request_id(), timeout_s=span_s + SLACK_S)


async def alpn_of(target: Target) -> str | None:
    """The protocol the site picks when a client offers HTTP/2 and HTTP/1.1 over TLS."""
    host, port = target.address()
    context = target.ssl_context(["h2", "http/1.1"])
    try:
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=context, server_hostname=host), timeout=10
        )
    except (OSError, TimeoutError, ssl.SSLError):
        return None
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        return ssl_object.selected_alpn_protocol() if ssl_object is not None else None
    finally:
        writer.close()


async def _none() -> None:
    return None


async def probes_take(options: DoctorOptions) -> Probes:
    """Probe the site and its worker side by side, which also tells the app's ping interval;
    then the other probes all at once."""
    host = urlsplit(options.url).netloc
    site = Target(options.url, host, options.authorization, options.cafile, options.insecure)
    worker = replace(site, url=options.direct) if options.direct else None
    first, direct = await asyncio.gather(
        _probe(site, ProbeSchedule()), _probe(worker, ProbeSchedule()) if worker else _none()
    )
    if first.status != 200:
        return Probes(proxy=first, direct=direct, tls=site.tls, direct_url=options.direct)
    # A stream whose frames could not be read (compressed as br, say) still gets every check.
    ping = float((first.hello or {}).get("ping_interval_s") or DEFAULT_PING_S)
    idle = ProbeSchedule(frames=1, idle_s=min(ping + IDLE_MARGIN_S, MAX_IDLE_S))
    bare = ProbeSchedule(accel=False)
    wants_idle = "idle_timeout" not in options.skip
    proxy_bare, direct_bare, idle_run, idle_direct, alpn = await asyncio.gather(
        _probe(site, bare),
        _probe(worker, bare) if worker else _none(),
        _probe(site, idle) if wants_idle else _none(),
        _probe(worker, idle) if worker and wants_idle else _none(),
        alpn_of(site) if site.tls else _none(),
    )
    return Probes(
        proxy=first,
        proxy_bare=proxy_bare,
        direct=direct,
        direct_bare=direct_bare,
        idle=idle_run,
        idle_direct=idle_direct,
        tls=site.tls,
        alpn=alpn,
        direct_url=options.direct,
    )


def doctor_run(options: DoctorOptions) -> list[Row]:
    """Every check's row; those in ``options.skip`` say so."""
    rows = diagnosis(asyncio.run(probes_take(options)))
    return [
        replace(row, verdict=SKIP, finding="skipped (--skip)") if row.id in options.skip else row
        for row in rows
    ]


def failed(rows: list[Row]) -> list[Row]:
    return [row for row in rows if row.verdict == FAIL]


def report_json(options: DoctorOptions, rows: list[Row]) -> str:
    document: dict[str, Any] = {
        "url": options.url,
        "direct": options.direct,
        "ok": not failed(rows),
        "checks": [row.as_dict() for row in rows],
    }
    return json.dumps(document, indent=2)


def report_table(options: DoctorOptions, rows: list[Row]) -> str:
    """The terminal's report: one line per check, then each finding with its fix."""
    direct = options.direct or "-"
    lines = [f"ttft_doctor: {options.url} (direct: {direct})", ""]
    table = [("check", "through the site's URL", "direct", "verdict")]
    table += [(row.title, row.proxy, row.direct, row.verdict) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(3)]
    for line in table:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        lines.append("  ".join([*cells, line[3]]).rstrip())
    notes = [row for row in rows if row.verdict not in (PASS, SKIP)]
    if notes:
        lines.append("")
    for row in notes:
        where = f" ({row.layer})" if row.layer else ""
        lines.append(f"{row.verdict.upper()} {row.title}{where}: {row.finding}")
        if row.fix:
            lines.append(f"    fix: {row.fix}")
    bad = failed(rows)
    lines += ["", f"{len(bad)} of {len(rows)} checks failed." if bad else "Every check passed."]
    return "\n".join(lines)


__all__ = ["CHECKS", "DoctorOptions", "doctor_run", "failed", "report_json", "report_table"]
