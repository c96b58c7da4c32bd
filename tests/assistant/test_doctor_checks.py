"""The doctor's verdicts (``assistant/doctor/checks.py``) on what probes saw, for the cases the
real nginx in tests/deploy/test_ttft_doctor.py cannot produce: faults of the app itself, a
stream nobody can read, a site that refuses."""

from assistant.doctor.checks import Probes, diagnosis
from assistant.doctor.client import Arrival, ProbeRun
from assistant.services.latency_probe import ProbeSchedule

SSE = [("content-type", "text/event-stream; charset=utf-8"), ("transfer-encoding", "chunked")]


def streamed(
    *, held_s: float = 0.0, headers: list[tuple[str, str]] | None = None, **fields: object
) -> ProbeRun:
    """A probe that read hello and two frames 0.25 s apart, the last ``held_s`` late."""
    hello = {"sent": 100.0, "http_version": "1.1", "connection": None, "ping_interval_s": 15.0}
    frames = [
        Arrival("hello", 100.0, 100.001, hello),
        Arrival("probe", 100.25, 100.251, {"sent": 100.25}),
        Arrival("probe", 100.5, 100.501 + held_s, {"sent": 100.5}),
    ]
    run = ProbeRun(
        schedule=ProbeSchedule(),
        status=200,
        version="HTTP/1.1",
        headers=headers or SSE,
        framing="chunked",
        frames=frames,
        end="done",
        headers_ms=3.0,
        first_frame_ms=3.1,
    )
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def rows(probes: Probes) -> dict[str, tuple[str, str]]:
    return {row.id: (row.verdict, row.layer) for row in diagnosis(probes)}


def test_a_fault_seen_directly_too_is_the_apps() -> None:
    """Compression and late frames measured at the worker as well are laid at the app's door,
    not the proxy's."""
    gzipped = [*SSE, ("content-encoding", "gzip")]
    late = streamed(held_s=0.4, headers=gzipped)
    verdicts = rows(Probes(proxy=late, proxy_bare=late, direct=late, direct_bare=late))
    assert verdicts["compression"] == ("fail", "app")
    assert verdicts["accel_header"] == ("fail", "app")
    # The bare probe's delay is the worker's too: not the proxy's buffering.
    assert verdicts["proxy_buffering"][0] == "skip"


def test_a_stream_that_cannot_be_read_still_names_its_compression() -> None:
    """br (which the doctor cannot decode): no frames, yet the probe answered and the
    compression check fails; the checks that need frames are skipped."""
    brotli = [*SSE, ("content-encoding", "br")]
    unread = ProbeRun(
        schedule=ProbeSchedule(),
        status=200,
        version="HTTP/1.1",
        headers=brotli,
        framing="chunked",
        end="done",
    )
    verdicts = rows(Probes(proxy=unread, proxy_bare=unread))
    assert verdicts["reach"][0] == "pass"
    assert verdicts["compression"] == ("fail", "proxy")
    assert verdicts["proxy_buffering"][0] == verdicts["accel_header"][0] == "skip"
    assert verdicts["upstream_http"][0] == "skip"


def test_a_refusal_is_the_only_row() -> None:
    refused = ProbeRun(schedule=ProbeSchedule(), status=401, end="refused", body=b'{"error": 1}')
    [row] = diagnosis(Probes(proxy=refused))
    assert (row.id, row.verdict) == ("reach", "fail")
    assert "--key" in row.fix


def test_without_a_worker_nothing_is_compared() -> None:
    """No --direct: the time rows pass on their figures alone, the rest judge the site."""
    verdicts = rows(Probes(proxy=streamed(headers_ms=900.0), proxy_bare=streamed()))
    assert verdicts["headers"] == ("pass", "")
    assert verdicts["http2"] == ("skip", "")
    assert {verdict for verdict, _ in verdicts.values()} == {"pass", "skip"}


def test_tls_without_h2_fails_and_names_the_listen_line() -> None:
    run = streamed()
    [row] = [r for r in diagnosis(Probes(proxy=run, tls=True, alpn="http/1.1")) if r.id == "http2"]
    assert (row.verdict, row.proxy) == ("fail", "http/1.1")
    assert "http2" in row.fix


def test_a_probe_that_could_not_measure_fails_its_row() -> None:
    """A later probe refused (a rate limit), or an idle probe that ran out of time: those rows
    fail, never pass, so the gate does not pass on what it never saw."""
    limited = ProbeRun(schedule=ProbeSchedule(), status=429, end="refused", body=b"slow down")
    late = ProbeRun(schedule=ProbeSchedule(idle_s=15.25), status=200, end="timeout")
    verdicts = rows(Probes(proxy=streamed(), proxy_bare=limited, idle=late))
    assert verdicts["proxy_buffering"] == ("fail", "")
    assert verdicts["idle_timeout"] == ("fail", "")
    [row] = [
        r
        for r in diagnosis(Probes(proxy=streamed(), proxy_bare=limited))
        if r.id == ("proxy_buffering")
    ]
    assert "429" in row.finding
