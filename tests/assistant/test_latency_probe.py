"""``GET /api/chat/stream/probe`` on a real Daphne: who may use it, what it refuses, and the
frames it sends on their schedule (``assistant/latency_probe.py``)."""

import itertools
import json
import time
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assistant.errors import Rejected
from assistant.services.api_keys import key_create, key_revoke
from assistant.services.latency_probe import (
    ProbeSchedule,
    frame_read,
    hello_frame,
    schedule_parse,
)
from tests.support import LiveServer, SSEReader

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/chat/stream/probe"


def probe(
    server: LiveServer,
    query: str = "",
    *,
    headers: dict[str, str] | None = None,
    cookies: dict[str, str] | None = None,
    method: str = "GET",
) -> tuple[httpx.Response, list[Any]]:
    """The response and its events, each stamped with its arrival (monotonic seconds)."""
    reader = SSEReader()
    events: list[Any] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as client:
        with client.stream(
            method, f"{PATH}?{query}", headers=headers or {}, cookies=cookies or {}
        ) as response:
            body = b""
            for chunk in response.iter_raw():
                body += chunk
                if response.status_code == 200:
                    events += reader.feed(chunk)
            response._content = body
    return response, events


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def code_of(response: httpx.Response) -> str:
    return json.loads(response.content)["error"]["code"]


@pytest.fixture
def key() -> str:
    return key_create(name="doctor", classroom=None, created_by=None)[1]


def test_a_key_gets_frames_on_their_schedule(daphne: LiveServer, key: str) -> None:
    """hello at once, then 3 frames at least 100 ms apart, then done; the worker's view of the
    request in hello; the stream's own headers, the app's X-Accel-Buffering included."""
    query = ProbeSchedule(frames=3, interval_ms=100).query()
    response, events = probe(daphne, query, headers={**bearer(key), "Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers.get("content-encoding") is None
    assert [e.event for e in events] == ["hello", "probe", "probe", "probe", "done"]
    hello = events[0].json()
    assert hello["http_version"] == "1.1"
    assert hello["accept_encoding"] == "gzip"
    assert hello["ping_interval_s"] == 15.0
    payloads = [e.json() for e in events]
    assert [p["seq"] for p in payloads] == [0, 1, 2, 3, 4]
    sent = [p["sent"] for p in payloads]
    arrived = [e.at for e in events]
    # Frames are written 100 ms apart (never sooner) and arrive as they are written.
    assert all(b - a >= 0.095 for a, b in itertools.pairwise(sent[:-1])), sent
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(arrived[:-1])), arrived


def test_without_accel_the_header_is_left_out(daphne: LiveServer, key: str) -> None:
    """``accel=0``: the same frames without X-Accel-Buffering, to see what a proxy does alone."""
    schedule = ProbeSchedule(frames=1, interval_ms=0, accel=False)
    response, events = probe(daphne, schedule.query(), headers=bearer(key))
    assert response.status_code == 200
    assert "x-accel-buffering" not in response.headers
    assert [e.event for e in events] == ["hello", "probe", "done"]


def test_idle_silence_comes_before_the_first_frame(daphne: LiveServer, key: str) -> None:
    """``idle_s``: nothing at all (no ping) for that long after hello, then the frames."""
    schedule = ProbeSchedule(frames=2, interval_ms=0, idle_s=1.0)
    _, events = probe(daphne, schedule.query(), headers=bearer(key))
    assert [e.event for e in events] == ["hello", "probe", "probe", "done"]
    assert events[1].at - events[0].at >= 0.95


def test_staff_may_probe_with_their_session(daphne: LiveServer) -> None:
    admin = get_user_model().objects.create_user("ops", is_staff=True)
    staff = Client()
    staff.force_login(admin)
    cookies = {"sessionid": staff.cookies["sessionid"].value}
    response, events = probe(daphne, "frames=0", cookies=cookies)
    assert response.status_code == 200
    assert [e.event for e in events] == ["hello", "done"]


@pytest.mark.parametrize(
    ("query", "status", "code"),
    [
        ("frames=21", 400, "probe_invalid"),
        ("frames=1.5", 400, "probe_invalid"),
        ("interval_ms=-1", 400, "probe_invalid"),
        ("idle_s=121", 400, "probe_invalid"),
        ("accel=2", 400, "probe_invalid"),
        ("frames=many", 400, "probe_invalid"),
    ],
)
def test_a_schedule_out_of_bounds_is_refused(
    daphne: LiveServer, key: str, query: str, status: int, code: str
) -> None:
    response, _ = probe(daphne, query, headers=bearer(key))
    assert (response.status_code, code_of(response)) == (status, code)


def test_who_is_refused(daphne: LiveServer, key: str) -> None:
    """No key and no session: 401; a student's or a non-staff user's session: 403; a made-up
    or revoked key: 401; a POST: 405 with Allow: GET; another host: 400."""
    anonymous, _ = probe(daphne)
    assert (anonymous.status_code, code_of(anonymous)) == (401, "login_required")

    user = Client()
    user.force_login(get_user_model().objects.create_user("pupil", is_staff=False))
    not_staff, _ = probe(daphne, cookies={"sessionid": user.cookies["sessionid"].value})
    assert (not_staff.status_code, code_of(not_staff)) == (403, "probe_forbidden")

    made_up, _ = probe(daphne, headers=bearer("csk-abcdefghij-" + "x" * 43))
    assert (made_up.status_code, code_of(made_up)) == (401, "invalid_api_key")

    row, revoked_key = key_create(name="old", classroom=None, created_by=None)
    key_revoke(row)
    revoked, _ = probe(daphne, headers=bearer(revoked_key))
    assert (revoked.status_code, code_of(revoked)) == (401, "invalid_api_key")

    posted, _ = probe(daphne, method="POST", headers=bearer(key))
    assert (posted.status_code, posted.headers["allow"]) == (405, "GET")

    elsewhere, _ = probe(daphne, headers={**bearer(key), "Host": "evil.example"})
    assert (elsewhere.status_code, code_of(elsewhere)) == (400, "bad_host")


def test_a_keys_probes_count_against_its_rate(daphne: LiveServer) -> None:
    _, key = key_create(name="slow", classroom=None, created_by=None, rate=2)
    statuses = [probe(daphne, "frames=0", headers=bearer(key))[0] for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    assert int(statuses[2].headers["retry-after"]) > 0


def test_leaving_ends_the_probe(daphne: LiveServer, key: str) -> None:
    """A client that leaves mid-probe frees its place at once: the next probes are served."""
    schedule = ProbeSchedule(frames=20, interval_ms=2000)
    with httpx.Client(base_url=f"http://127.0.0.1:{daphne.port}", timeout=10) as client:
        for _ in range(20):  # more than MAX_RUNNING, one after another
            with client.stream("GET", f"{PATH}?{schedule.query()}", headers=bearer(key)) as r:
                assert r.status_code == 200
                next(r.iter_raw())
    started = time.monotonic()
    response, _ = probe(daphne, "frames=0", headers=bearer(key))
    assert response.status_code == 200
    assert time.monotonic() - started < 10


def test_schedule_parse_defaults_and_round_trip() -> None:
    assert schedule_parse(b"") == ProbeSchedule()
    schedule = ProbeSchedule(frames=3, interval_ms=40, idle_s=2.5, accel=False)
    assert schedule_parse(schedule.query().encode()) == schedule
    with pytest.raises(Rejected):
        schedule_parse(b"frames=\xff")


def test_frames_read_back() -> None:
    frame = hello_frame(http_version="1.0", connection="close", accept_encoding=None, ping_s=2)
    event, data = frame.decode().split("\n")[:2]
    payload = frame_read(event.removeprefix("event: "), data.removeprefix("data: "))
    assert payload is not None
    assert payload["http_version"] == "1.0" and payload["connection"] == "close"
    assert abs(payload["sent"] - time.time()) < 60
    assert frame_read("token", data.removeprefix("data: ")) is None
    assert frame_read("probe", "not json") is None
    assert frame_read("probe", '{"seq": 1}') is None
