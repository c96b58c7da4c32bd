"""The doctor's checks: pure functions from what the probes saw to one row per layer.

Each row says what was measured through the site's URL (``proxy``) and, when a worker's own
URL was given, directly (``direct``); a verdict (pass, warn, fail or skip); and, for anything
but a pass, what was found and the fix. Comparing the two URLs names the layer: a fault seen
through the proxy only is the proxy's, one seen directly too is the app's or its server's. A
probe that could not measure fails its row: a deploy gate must not pass on what it never saw.
"""

from dataclasses import replace
from typing import Any

from assistant.doctor.client import ProbeRun
from assistant.doctor.verdicts import (
    FAIL,
    HELD_MS,
    PASS,
    SKIP,
    WARN,
    Probes,
    Row,
    flagged,
    held_ms,
    ms,
    trouble,
    unmeasured,
)


def reach_row(probes: Probes) -> Row:
    run = probes.proxy
    content_type = run.header("content-type") or ""
    row = Row(
        "reach",
        "probe answered",
        PASS,
        f"{run.status or '-'} {content_type.split(';')[0]}".strip(),
        figures={"status": run.status, "end": run.end},
    )
    if run.status == 200 and content_type.startswith("text/event-stream"):
        return row
    said = run.body[:200].decode("utf-8", "replace")
    if run.status is None:
        return flagged(
            row,
            "network",
            run.error or "no answer",
            "Check the URL, that the site is up and that this machine may reach it.",
        )
    if run.status in (401, 403):
        fix = "Use a valid API key (--key, or CHATSITE_DOCTOR_KEY), or run it on the server."
        return flagged(row, "app", f"{run.status}: {said}", fix)
    if run.status == 404:
        fix = "Proxy /api/chat/stream/ to the workers (snippets/chatsite-server.conf)."
        return flagged(row, "proxy", "404: the probe is not served at this URL", fix)
    return flagged(row, "app", f"{run.status}: {said}", "See the site's log for this request.")


def direct_row(probes: Probes) -> Row:
    """The worker measured directly, when ``--direct`` named one: without it, nothing says which
    layer a fault is in, so a worker that did not answer fails the gate."""
    if probes.direct_url is None:
        return Row("direct", "worker reached directly", SKIP, finding="no --direct given")
    run = probes.direct
    row = Row("direct", "worker reached directly", PASS, "", str(run.status if run else "-"))
    why = trouble(run)
    if why is None:
        return row
    return flagged(
        row,
        "network",
        f"{probes.direct_url} did not answer the probe: {why}",
        "Give --direct one worker's own address (http://127.0.0.1:8001, on the server); the "
        "doctor sends it the site's Host.",
    )


def _timing_row(probes: Probes, *, id: str, title: str, attr: str) -> Row:
    proxy = getattr(probes.proxy, attr)
    direct = getattr(probes.direct, attr) if probes.direct is not None else None
    figures = {"proxy_ms": proxy, "direct_ms": direct}
    row = Row(id, title, PASS, ms(proxy), ms(direct), figures=figures)
    if proxy is None or direct is None or proxy - direct <= HELD_MS:
        return row
    finding = f"{proxy - direct:.0f} ms later through the proxy than directly"
    return flagged(row, "proxy", finding, "The rows below name what holds it back.")


def headers_row(probes: Probes) -> Row:
    return _timing_row(probes, id="headers", title="time to headers", attr="headers_ms")


def first_byte_row(probes: Probes) -> Row:
    return _timing_row(probes, id="first_byte", title="time to first frame", attr="first_frame_ms")


def _held_text(run: ProbeRun | None) -> str:
    held = held_ms(run)
    return "-" if held is None else f"held {held:.0f} ms"


def _held_row(
    id: str, title: str, run: ProbeRun | None, direct: ProbeRun | None, figures: dict[str, Any]
) -> Row:
    """A buffering row that passes; fails when its probe could not measure, and is skipped
    when its frames could not be read (a compression the doctor cannot undo)."""
    row = Row(id, title, PASS, _held_text(run), _held_text(direct), figures=figures)
    why = trouble(run)
    if why is not None:
        return unmeasured(row, why)
    if held_ms(run) is None:
        return replace(row, verdict=SKIP, finding="its frames could not be read")
    return row


def buffering_rows(probes: Probes) -> list[Row]:
    """Two rows: frames sent 250 ms apart without the app's ``X-Accel-Buffering: no`` (what the
    proxy does on its own) and with it (what every stream sends)."""
    with_header, bare = held_ms(probes.proxy), held_ms(probes.proxy_bare)
    direct_held = held_ms(probes.direct)
    figures = {
        "proxy_held_ms": with_header,
        "proxy_bare_held_ms": bare,
        "direct_held_ms": direct_held,
    }
    app_holds = direct_held is not None and direct_held > HELD_MS
    bare_row = _held_row(
        "proxy_buffering", "proxy buffering", probes.proxy_bare, probes.direct_bare, figures
    )
    if bare is not None and bare > HELD_MS and app_holds:
        finding = "the worker itself holds frames back: see the next row"
        bare_row = replace(bare_row, verdict=SKIP, finding=finding)
    elif bare is not None and bare > HELD_MS:
        bare_row = flagged(
            bare_row,
            "proxy",
            f"the proxy holds an event stream's frames back ({bare:.0f} ms) unless the app "
            "sends X-Accel-Buffering: no",
            "proxy_buffering off; in every event-stream location (snippets/chatsite-sse.conf)",
        )
    accel_row = _held_row(
        "accel_header", "X-Accel-Buffering: no", probes.proxy, probes.direct, figures
    )
    if with_header is not None and with_header > HELD_MS and app_holds:
        accel_row = flagged(
            accel_row,
            "app",
            f"the worker itself sends frames late or in bursts ({direct_held:.0f} ms held)",
            "Look for a middleware or server option that buffers responses on the workers.",
        )
    elif with_header is not None and with_header > HELD_MS:
        accel_row = flagged(
            accel_row,
            "proxy",
            f"frames sent 250 ms apart arrive together ({with_header:.0f} ms held) although "
            "the app sends X-Accel-Buffering: no: the proxy ignores the header "
            "(proxy_ignore_headers) and buffers",
            "proxy_buffering off; and no proxy_ignore_headers X-Accel-Buffering in the "
            "event-stream locations",
        )
    return [bare_row, accel_row]


def compression_row(probes: Probes) -> Row:
    proxy = probes.proxy.header("content-encoding")
    direct = probes.direct.header("content-encoding") if probes.direct is not None else None
    row = Row(
        "compression",
        "compression (gzip, br offered)",
        PASS,
        proxy or "none",
        "-" if probes.direct is None else direct or "none",
    )
    if direct:
        return flagged(
            row,
            "app",
            f"the worker compresses event streams ({direct}): compression holds bytes "
            "back until a block fills",
            "Take event streams out of the app's compression (a GZip middleware).",
        )
    if proxy:
        return flagged(
            row,
            "proxy",
            f"the proxy compresses event streams ({proxy}) for a client that offers it",
            "gzip off; in the event-stream locations, and never text/event-stream in "
            "gzip_types (snippets/chatsite-sse.conf, chatsite-server.conf)",
        )
    return row


def _framing_text(run: ProbeRun | None) -> str:
    if run is None or run.status is None:
        return "-"
    if run.framing_error:
        return "broken"
    return {"chunked": "chunked", "length": "Content-Length", "close": "until close"}.get(
        run.framing, run.framing or "-"
    )


def framing_row(probes: Probes) -> Row:
    run = probes.proxy
    row = Row("framing", "framing", PASS, _framing_text(run), _framing_text(probes.direct))
    direct = probes.direct
    layer = (
        "app"
        if direct is not None
        and (direct.framing_error or direct.stray or direct.framing == "length")
        else "proxy"
    )
    if run.framing_error:
        return flagged(
            row,
            layer,
            f"broken Transfer-Encoding: {run.framing_error}",
            "A layer rewrites the response's framing: remove any hand-set "
            "Transfer-Encoding or Content-Length header on event streams.",
        )
    if run.framing == "length":
        return flagged(
            row,
            layer,
            "the event stream came with a Content-Length: a layer read the whole "
            "answer before sending any of it",
            "Stream the response through (proxy_buffering off; no response body filter).",
        )
    if run.stray:
        return flagged(
            row,
            layer,
            f"bytes that are not an event stream arrived among the frames: {run.stray!r}",
            "A layer writes into the response body (a log line, a banner, an injected "
            "script): keep event-stream responses byte for byte.",
        )
    if run.status == 200 and (run.framing == "close" or run.version == "HTTP/1.0"):
        return flagged(
            row,
            "proxy",
            f"{run.version} response that ends by closing its connection: nothing is "
            "kept alive between questions",
            "Serve HTTP/1.1 with chunked responses to clients.",
            verdict=WARN,
        )
    return row


def upstream_row(probes: Probes) -> Row:
    hello = probes.proxy.hello
    if hello is None:
        return Row("upstream_http", "HTTP to the workers", SKIP, finding="the probe did not answer")
    version = str(hello.get("http_version"))
    connection = hello.get("connection")
    text = f"HTTP/{version}" + (f", Connection: {connection}" if connection else "")
    row = Row("upstream_http", "HTTP to the workers", PASS, text, "-")
    if version == "1.0":
        return flagged(
            row,
            "proxy",
            "the proxy speaks HTTP/1.0 to the workers: a new connection for every "
            "question, and no chunks, so a buffering proxy holds whole answers",
            'proxy_http_version 1.1; and proxy_set_header Connection ""; '
            "(snippets/chatsite-proxy.conf)",
        )
    if connection and connection.lower() == "close":
        return flagged(
            row,
            "proxy",
            "the proxy closes its connection to the worker after each request: each "
            "question waits for a new one",
            'proxy_set_header Connection ""; with keepalive in the upstream block',
            verdict=WARN,
        )
    return row


def idle_row(probes: Probes) -> Row:
    run = probes.idle
    if run is None:
        return Row("idle_timeout", "idle timeout", SKIP, finding="skipped")
    silence = run.schedule.idle_s
    direct = probes.idle_direct
    text = {"done": f"{silence:g} s silence kept", "cut": "cut"}.get(run.end, run.end)
    direct_text = (
        "-"
        if direct is None
        else ({"done": f"{silence:g} s silence kept", "cut": "cut"}.get(direct.end, direct.end))
    )
    figures = {
        "silence_s": silence,
        "proxy_end": run.end,
        "cut_after_s": run.silent_s,
        "direct_end": direct.end if direct is not None else None,
    }
    row = Row("idle_timeout", "idle timeout", PASS, text, direct_text, figures=figures)
    if run.end == "done":
        return row
    if run.end != "cut":
        return unmeasured(row, trouble(run) or run.end)
    ping = float((probes.proxy.hello or {}).get("ping_interval_s") or silence)
    app = direct is not None and direct.end == "cut"
    after = f"{run.silent_s:.1f} s" if run.silent_s is not None else "some time"
    return flagged(
        row,
        "app" if app else "proxy",
        f"the stream was closed after {after} of silence, shorter than the app's ping "
        f"interval ({ping:g} s): a model that thinks that long loses the student's answer",
        (
            "The worker's server closes idle responses: raise its timeout"
            if app
            else f"proxy_read_timeout (nginx) above {ping:g} s, or a smaller CHATSITE_PING_INTERVAL"
        ),
    )


def http2_row(probes: Probes) -> Row:
    if not probes.tls:
        return Row("http2", "HTTP/2 over TLS", SKIP, "plain HTTP", finding="not served over TLS")
    row = Row("http2", "HTTP/2 over TLS", PASS, probes.alpn or "no protocol named")
    if probes.alpn == "h2":
        return row
    return flagged(
        row,
        "proxy",
        "TLS without HTTP/2: a browser opens at most 6 connections to the site, and a "
        "7th stream (more tabs, the dashboard) waits for one to end",
        "listen 443 ssl http2; (nginx before 1.25.1) or http2 on;",
    )


CHECKS = (
    "reach",
    "direct",
    "headers",
    "first_byte",
    "proxy_buffering",
    "accel_header",
    "compression",
    "framing",
    "upstream_http",
    "idle_timeout",
    "http2",
)


def diagnosis(probes: Probes) -> list[Row]:
    """Every row, in the order a first token passes the layers."""
    reach = reach_row(probes)
    if reach.verdict == FAIL:
        return [reach]
    return [
        reach,
        direct_row(probes),
        headers_row(probes),
        first_byte_row(probes),
        *buffering_rows(probes),
        compression_row(probes),
        framing_row(probes),
        upstream_row(probes),
        idle_row(probes),
        http2_row(probes),
    ]
