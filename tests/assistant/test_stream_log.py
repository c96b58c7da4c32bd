"""Each stream's ``stream ended`` JSON line, written by a real Daphne with CHATSITE_LOG_FORMAT=json:
one per answer on every serving path, under the request id the client was given, with every
stage timing and no owner key or session; a crash's traceback in the log and never in the
response."""

import json
import logging
import time
import uuid
from typing import Any

import httpx
import pytest

from assistant.models import StreamRecord
from assistant.services.api_keys import key_create
from assistant.services.telemetry import stream_refused
from assistant.services.timings import StreamTimings, now
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: The stage timings StreamRecord stores, and so the line carries under the same names.
TIMINGS = (
    "parse_ms",
    "queue_ms",
    "engine_ttft_ms",
    "server_ttft_ms",
    "itl_mean_ms",
    "itl_max_ms",
    "e2e_ms",
    "server_span_ms",
)
FIELDS = {
    *("time", "level", "logger", "message", "request_id", "path", "engine", "server", "classroom"),
    *("owner_kind", "outcome", "error_code", "tokens", "server_burst_gaps", *TIMINGS),
}


@pytest.fixture(scope="module")
def server(daphne_factory) -> LiveServer:
    """A Daphne of its own that writes JSON log lines."""
    return daphne_factory(CHATSITE_LOG_FORMAT="json")


def json_lines(server: LiveServer) -> list[dict[str, Any]]:
    """The log's JSON lines (Daphne's own lines, through the root logger, stay plain)."""
    found = []
    for line in server.log().splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def ended_lines(server: LiveServer, request_id: str) -> list[dict[str, Any]]:
    return [
        o
        for o in json_lines(server)
        if o["message"] == "stream ended" and o.get("request_id") == request_id
    ]


def ended_line(server: LiveServer, request_id: str) -> tuple[dict[str, Any], str]:
    """The one ``stream ended`` object of ``request_id`` and its raw line."""
    (found,) = wait_for(lambda: ended_lines(server, request_id))
    raw = next(line for line in server.log().splitlines() if f'"request_id":"{request_id}"' in line)
    return found, raw


def assert_ok_line(line: dict[str, Any], *, path: str, owner_kind: str, tokens: int) -> None:
    assert set(line) == FIELDS
    assert (line["level"], line["logger"]) == ("INFO", "assistant.streams")
    assert (line["path"], line["engine"], line["outcome"]) == (path, "scripted", "ok")
    # Under Daphne's worker (chatsite/server.py), which names its server.
    assert line["server"] == "daphne"
    assert (line["error_code"], line["classroom"]) == ("", None)
    assert (line["owner_kind"], line["tokens"]) == (owner_kind, tokens)
    for name in TIMINGS:
        assert isinstance(line[name], int | float) and line[name] >= 0, (name, line[name])
    assert line["parse_ms"] <= line["server_ttft_ms"] <= line["e2e_ms"]


@pytest.mark.parametrize("path", ["direct", "django"])
def test_a_page_answer_writes_one_line_under_its_request_id(server: LiveServer, path: str) -> None:
    """One ``stream ended`` line per answer, under the X-Request-ID the response carried, with
    the same figures as the stored record and neither the owner key nor the session key."""
    client = ChatClient(server)
    try:
        response = client.raw(
            {"message": "[scripted tokens=3 ttft_ms=0] hi"}, path=f"/api/chat/stream/{path}"
        )
        assert response.status == 200
        request_id = response.header("x-request-id")
        assert request_id and list(response.events())[-1].event == "done"
        session_key = client.session_key
    finally:
        client.close()
    line, raw = ended_line(server, request_id)
    assert_ok_line(line, path=path, owner_kind="session", tokens=3)
    record = wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).first())
    assert line["server_ttft_ms"] == record.server_ttft_ms and line["e2e_ms"] == record.e2e_ms
    owner = record.owner_key.partition(":")[2]
    assert owner and owner not in raw and session_key not in raw


def test_an_api_completion_writes_one_line_on_the_api_path(server: LiveServer) -> None:
    """A streamed /v1/chat/completions answer: its line is on the ``api`` path, owner kind
    ``key``, and names neither the key nor its id."""
    row, key = key_create(name="logs", classroom=None, created_by=None)
    body = {
        "model": "chatsite",
        "stream": True,
        "messages": [{"role": "user", "content": "[scripted tokens=3 ttft_ms=0] hi"}],
    }
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=20
    ) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        text = response.read().decode()
    assert text.rstrip().endswith("data: [DONE]")
    line, raw = ended_line(server, request_id)
    assert_ok_line(line, path="api", owner_kind="key", tokens=3)
    assert key not in raw and str(row.id) not in raw and row.prefix not in raw


def test_a_crash_keeps_its_traceback_in_the_log_only(server: LiveServer) -> None:
    """A server fault inside a stream: the log has the exception with its whole traceback
    and a ``stream ended`` line with outcome server_error; the response has a
    ``server_error`` event and nothing of the traceback. (A directive the scripted engine
    cannot read, ``ttft_ms=soon``, raises ValueError inside the engine: the stand-in for a
    bug, since no real input may crash the server.)"""
    client = ChatClient(server)
    try:
        response = client.raw({"message": "[scripted ttft_ms=soon] hi"})
        assert response.status == 200
        request_id = response.header("x-request-id")
        body = response.body()
    finally:
        client.close()
    events = body.decode()
    assert "event: error" in events and "server_error" in events
    for leak in ("Traceback", "ValueError", 'File "', ".py", "soon"):
        assert leak not in events, leak
    ended, _ = ended_line(server, request_id)
    assert (ended["outcome"], ended["error_code"], ended["tokens"]) == (
        "server_error",
        "server_error",
        0,
    )
    crashed = wait_for(
        lambda: [
            o
            for o in json_lines(server)
            if o["level"] == "ERROR" and request_id in o["message"] and "traceback" in o
        ]
    )
    (crash,) = crashed
    assert crash["logger"] == "assistant.services.answer"
    assert crash["error"].startswith("ValueError: ")
    assert crash["traceback"].startswith("Traceback (most recent call last):\n")
    assert "assistant/engines/scripted.py" in crash["traceback"]


def test_a_refused_stream_writes_one_line_too(streams_log: list[logging.LogRecord]) -> None:
    """A stream the engine refused (503) is logged as it is counted: engine_error with the
    engine's reason, its parse time, and no owner (not known yet). Called directly: the
    scripted engine cannot be made to fail its check for one request, and the engines that
    can (a model that does not load) are tested for their 503 elsewhere."""
    timings = StreamTimings(received=now() - 0.01)
    timings.parsed = now()
    request_id = uuid.uuid4().hex
    before = time.time()
    stream_refused(
        request_id=request_id,
        serving_path="django",
        engine="vllm",
        reason="engine_busy",
        timings=timings,
    )
    (record,) = streams_log  # at once: a refusal does not wait for others
    assert before <= record.created <= time.time()
    fields = {name: getattr(record, name) for name in FIELDS - {"time", "level", "logger"}}
    assert record.getMessage() == fields.pop("message") == "stream ended"
    assert fields["request_id"] == request_id
    assert (fields["path"], fields["engine"]) == ("django", "vllm")
    assert (fields["outcome"], fields["error_code"]) == ("engine_error", "engine_busy")
    assert (fields["owner_kind"], fields["classroom"], fields["tokens"]) == (None, None, 0)
    assert fields["parse_ms"] > 0 and fields["server_ttft_ms"] is None
