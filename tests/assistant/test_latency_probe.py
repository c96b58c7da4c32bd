"""``GET /api/chat/stream/probe`` on a real Daphne: who may use it, what it refuses, and the
frames it sends on their schedule (``assistant/latency_probe.py``)."""

import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assistant.errors import Rejected
from assistant.models import Classroom
from assistant.services.api_keys import key_create, key_revoke
from assistant.services.classrooms import join_code_new
from assistant.services.latency_probe import (
    ProbeSchedule,
    frame_read,
    hello_frame,
    schedule_parse,
)
from tests.support import LiveServer, SSEReader, wait_for

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
    # Written 100 ms apart, never sooner (the server's clock)...
    assert all(b - a >= 0.095 for a, b in itertools.pairwise(sent[:-1])), sent
    # ...and none of them held back on the way, against the others (generous: a busy machine).
    delays = [e.at - p["sent"] for e, p in zip(events, payloads, strict=True)]
    assert max(delays) - min(delays) < 0.5, delays


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
    assert events[1].json()["sent"] - events[0].json()["sent"] >= 0.99


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
    # Counted per minute: should the probes cross into the next one, at most four pass.
    statuses = []
    for _ in range(5):
        response = probe(daphne, "frames=0", headers=bearer(key))[0]
        statuses.append(response.status_code)
        if response.status_code != 200:
            break
    assert statuses[-1] == 429 and 2 <= len(statuses) - 1 <= 4, statuses
    assert int(response.headers["retry-after"]) > 0


def test_a_caller_runs_four_probes_at_once(daphne: LiveServer, key: str) -> None:
    """A fifth probe of the same key while four run is 503 ``probe_busy`` with Retry-After;
    another key is not held up; once the four leave, the key probes again."""
    schedule = ProbeSchedule(frames=20, interval_ms=2000)
    base = f"http://127.0.0.1:{daphne.port}"
    # Each reader is kept: a dropped one would close its connection at once.
    readers: list[Iterator[bytes]] = []
    with contextlib.ExitStack() as held:
        for _ in range(4):
            client = held.enter_context(httpx.Client(base_url=base, timeout=10))
            response = held.enter_context(
                client.stream("GET", f"{PATH}?{schedule.query()}", headers=bearer(key))
            )
            assert response.status_code == 200
            readers.append(response.iter_raw())
            next(readers[-1])
        busy, _ = probe(daphne, "frames=0", headers=bearer(key))
        assert (busy.status_code, code_of(busy)) == (503, "probe_busy")
        assert busy.headers["retry-after"] == "5"
        other = key_create(name="other", classroom=None, created_by=None)[1]
        assert probe(daphne, "frames=0", headers=bearer(other))[0].status_code == 200
    # The four left: their seats come back as the server sees each disconnect.
    wait_for(lambda: probe(daphne, "frames=0", headers=bearer(key))[0].status_code == 200)


def test_a_class_key_may_not_probe(daphne: LiveServer) -> None:
    """The probe is an operator's tool: a key made for a class (and handed to its tools) is
    refused, 403."""
    classroom = Classroom.objects.create(name="Physics", join_code=join_code_new())
    _, class_key = key_create(name="physics", classroom=classroom, created_by=None)
    refused, _ = probe(daphne, "frames=0", headers=bearer(class_key))
    assert (refused.status_code, code_of(refused)) == (403, "probe_forbidden")


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
