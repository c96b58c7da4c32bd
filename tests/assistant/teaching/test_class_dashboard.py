"""What a teacher sees of their classes (``/teach/dashboard/``, ``/teach/api/figures``,
``/teach/<id>/questions``, ``/teach/<id>/records.csv``): who may see which class, and the figures
counted from the class's stream records (the live counts, the CSV and the recent questions:
``test_class_records.py``)."""

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from assistant.models import ClassLoad, Classroom, StreamRecord
from assistant.services.class_figures import class_figures
from tests.assistant.teaching.teaching_support import (
    ROLES,
    World,
    body_of,
    expected,
    figures_by_id,
    summary,
)

DAPHNE = pytest.mark.django_db(transaction=True)
CSV_HEADER = (
    "time,student,request_id,serving_path,engine,outcome,error_code,tokens,"
    "server_ttft_ms,browser_ttft_ms,inter_token_mean_ms,total_ms"
)


# Who may see what: every role on each of the four endpoints.


def rows_shown(html: str) -> set[str]:
    return set(re.findall(r'<tr data-class="([^"]+)"', html))


def visible(world: World, role: str) -> set[str]:
    return {
        "teacher": {str(world.physics.id)},
        "other_teacher": {str(world.chemistry.id)},
        "admin": {str(world.physics.id), str(world.chemistry.id)},
    }[role]


def lists_visible_classes(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    payload = response.json()
    assert payload["window"] == "1h"
    assert {c["id"] for c in payload["classes"]} == visible(world, role)
    assert len(payload["classes"]) == len(visible(world, role))


def shows_visible_rows(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    html = response.content.decode()
    assert rows_shown(html) == visible(world, role)
    names = {c.name for c in (world.physics, world.chemistry) if c.name in html}
    expected = {
        c.name for c in (world.physics, world.chemistry) if str(c.id) in visible(world, role)
    }
    assert names == expected


def shows_questions_page(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    html = response.content.decode()
    assert "Recent questions in Physics 7A" in html
    assert 'id="questions-private"' in html  # physics keeps its questions to its students


def sends_csv(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith(
        f'attachment; filename="class-{world.physics.join_code}-'
    )
    assert body_of(response) == ("\ufeff" + CSV_HEADER + "\r\n").encode()


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: Callable[[World], str]
    ok: Callable[[Any, World, str], None]
    api: bool = False
    of_class: bool = False


ENDPOINTS = [
    Endpoint("figures", lambda w: "/teach/api/figures", lists_visible_classes, api=True),
    Endpoint("dashboard", lambda w: "/teach/dashboard/", shows_visible_rows),
    Endpoint(
        "questions",
        lambda w: f"/teach/{w.physics.id}/questions",
        shows_questions_page,
        of_class=True,
    ),
    Endpoint("records", lambda w: f"/teach/{w.physics.id}/records.csv", sends_csv, of_class=True),
]


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
@pytest.mark.parametrize("role", ROLES)
def test_each_role_sees_only_what_it_may(world: World, role: str, endpoint: Endpoint) -> None:
    """A class's teacher sees it, an admin sees every class, another teacher gets 404 for it and
    sees only their own; students (a joined session, no login) and visitors are sent to the
    login page, or get 401 ``login_required`` from the API; an account that may not teach gets
    403 (``teachers_only`` from the API)."""
    response = world.client(role).get(endpoint.url(world))
    outcome = expected(role, of_class=endpoint.of_class)
    if outcome == "ok":
        endpoint.ok(response, world, role)
    elif outcome == "login" and endpoint.api:
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "login_required"
    elif outcome == "login":
        assert response.status_code == 302
        assert response["Location"] == f"/teach/login/?next={endpoint.url(world)}"
    elif outcome == "403" and endpoint.api:
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "teachers_only"
    elif outcome == "403":
        assert response.status_code == 403
        assert b"Teachers only" in response.content
    else:
        assert response.status_code == 404
        assert world.physics.join_code not in response.content.decode()
        assert "Physics 7A" not in response.content.decode()


@pytest.mark.django_db
def test_the_figures_window_must_be_one_of_the_three(world: World) -> None:
    teacher = world.client("teacher")
    for window in ("5m", "1h", "24h"):
        response = teacher.get(f"/teach/api/figures?window={window}")
        assert response.status_code == 200 and response.json()["window"] == window
    for window in ("7d", "", "1H", "5m "):
        response = teacher.get("/teach/api/figures", {"window": window})
        assert response.status_code == 400, window
        assert response.json()["error"]["code"] == "window_invalid"
    # Who asks is checked before what they ask.
    anonymous = world.client("anonymous").get("/teach/api/figures?window=7d")
    assert anonymous.status_code == 401
    assert teacher.post("/teach/api/figures").status_code == 405


# The figures, from stream records.


def record(
    classroom: Classroom | None,
    owner: str,
    ago: timedelta,
    outcome: str = "ok",
    *,
    server: float | None = None,
    client: dict[str, float | None] | None = None,
) -> StreamRecord:
    """A stream record ``ago`` before now; ``client``: what the browser reported (ttft, waited,
    done), else it reported nothing."""
    reported = client is not None
    client = client or {}
    return StreamRecord.objects.create(
        request_id=uuid.uuid4().hex,
        created_at=timezone.now() - ago,
        owner_key=owner,
        classroom_id=classroom.id if classroom else None,
        path="direct",
        engine="scripted",
        outcome=outcome,
        server_ttft_ms=server,
        client_ttft_ms=client.get("ttft"),
        client_waited_ms=client.get("waited"),
        client_done_ms=client.get("done"),
        client_reported_at=timezone.now() if reported else None,
    )


MINUTE = timedelta(minutes=1)


@pytest.mark.django_db
def test_the_figures_count_the_records_of_each_class_in_the_window(world: World) -> None:
    """Questions, server faults and abandoned answers in the window; TTFT percentiles (numpy's
    linear interpolation) as the server and the browser saw them, the browser's only from
    reported records and, without a first token, the time waited; students active in the last
    5 minutes or asking now on any fresh worker. Nothing outside the window, of another class
    or from a worker silent for over 10 s counts."""
    physics, chemistry = world.physics, world.chemistry
    record(physics, "A", 1 * MINUTE, server=100, client={"ttft": 150})
    record(physics, "B", 10 * MINUTE, server=200, client={"ttft": 260})
    record(physics, "A", 20 * MINUTE, "engine_error")
    record(physics, "B", 30 * MINUTE, "timeout", server=300, client={"waited": 4000})
    record(physics, "C", 40 * MINUTE, "client_abort", server=400, client={"done": 2500})
    record(physics, "C", 50 * MINUTE, "server_error", server=1000)
    record(physics, "A", 55 * MINUTE, "slow_client", server=500, client={"ttft": 700})  # no fault
    # A browser's TTFT without its report (client_reported_at) is not counted.
    StreamRecord.objects.filter(owner_key="C", outcome="server_error").update(client_ttft_ms=1)
    # Outside the hour.
    record(physics, "A", 70 * MINUTE, "engine_error", server=9)
    record(physics, "D", 120 * MINUTE, "client_abort", server=8, client={"ttft": 8})
    # Another class, and no class.
    record(chemistry, "E", 2 * MINUTE, "engine_error", server=9999, client={"ttft": 9999})
    record(None, "F", 1 * MINUTE, "timeout", server=1)
    now = timezone.now()
    ClassLoad.objects.create(
        worker="w1",
        updated_at=now,
        classes={str(physics.id): {"streaming": 2, "waiting": 1, "students": ["A", "G"]}},
    )
    ClassLoad.objects.create(
        worker="w2",
        updated_at=now,
        classes={
            str(physics.id): {"streaming": 1, "waiting": 0, "students": ["H"]},
            str(uuid.uuid4()): {"streaming": 7, "waiting": 7, "students": ["X"]},
        },
    )
    ClassLoad.objects.create(
        worker="stopped",
        updated_at=now - timedelta(seconds=11),
        classes={str(physics.id): {"streaming": 5, "waiting": 5, "students": ["Z"]}},
    )

    hour = figures_by_id(world.client("admin"))
    assert hour[str(physics.id)] == {
        "id": str(physics.id),
        "name": "Physics 7A",
        "paused": False,
        "teachers_read": False,
        "active": 3,  # A (asked a minute ago, and asking now), G and H (asking now)
        "streaming": 3,
        "waiting": 1,
        "questions": 7,
        "errors": 3,  # engine_error, timeout, server_error
        "abandoned": 1,
        # 100 200 300 400 500 1000
        "server_ttft_ms": summary(6, 350.0, 875.0, 975.0),
        # 150 260 700 2500 4000
        "client_ttft_ms": summary(5, 700.0, 3700.0, 3940.0),
    }
    assert hour[str(chemistry.id)] == {
        "id": str(chemistry.id),
        "name": "Chemistry 9B",
        "paused": False,
        "teachers_read": False,
        "active": 1,
        "streaming": 0,
        "waiting": 0,
        "questions": 1,
        "errors": 1,
        "abandoned": 0,
        "server_ttft_ms": summary(1, 9999.0, 9999.0, 9999.0),
        "client_ttft_ms": summary(1, 9999.0, 9999.0, 9999.0),
    }
    assert set(hour) == {str(physics.id), str(chemistry.id)}

    five = figures_by_id(world.client("teacher"), "5m")
    assert set(five) == {str(physics.id)}
    assert five[str(physics.id)]["questions"] == 1
    assert five[str(physics.id)]["server_ttft_ms"] == summary(1, 100.0, 100.0, 100.0)
    assert five[str(physics.id)]["active"] == 3

    day = figures_by_id(world.client("teacher"), "24h")[str(physics.id)]
    assert (day["questions"], day["errors"], day["abandoned"]) == (9, 4, 2)
    # 8 9 100 200 300 400 500 1000
    assert day["server_ttft_ms"] == summary(8, 250.0, 825.0, 965.0)


@pytest.mark.django_db
def test_the_window_and_the_active_span_include_their_first_instant(world: World) -> None:
    """At a fixed now: a record exactly one window old counts, one a second older or in the
    future does not; a student whose record is exactly 5 minutes old is still active."""
    now = timezone.now().replace(microsecond=0)
    physics = world.physics

    def at(owner: str, moment: datetime, server: float) -> None:
        StreamRecord.objects.create(
            request_id=uuid.uuid4().hex,
            created_at=moment,
            owner_key=owner,
            classroom_id=physics.id,
            path="direct",
            engine="scripted",
            outcome="ok",
            server_ttft_ms=server,
        )

    at("edge", now - timedelta(seconds=3600), 10)
    at("older", now - timedelta(seconds=3601), 20)
    at("future", now + timedelta(seconds=1), 30)
    at("five", now - timedelta(seconds=300), 40)
    at("six", now - timedelta(seconds=301), 50)
    figures = class_figures([physics.id], window_s=3600, now=now)[str(physics.id)]
    assert figures["questions"] == 3  # edge, five, six
    assert figures["server_ttft_ms"] == summary(3, 40.0, 49.0, 49.8)
    assert figures["active"] == 1  # five
    short = class_figures([physics.id], window_s=60, now=now)[str(physics.id)]
    assert (short["questions"], short["active"]) == (0, 1)
