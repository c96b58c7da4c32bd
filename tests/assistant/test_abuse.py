"""One client cannot keep a class from the model: floods of streams against a real Daphne, both
directly and through the shipped nginx config, each client on its own loopback address
(127.0.0.0/8 is all this host's, so the server sees them as different machines).

The server has 8 seats on its engine, 6 per address and 12 new sessions per address and minute,
and resumes kept for 30 s as in production. In each flood an ordinary student from another
address is still answered, and the flood shows in /metrics.
"""

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from assistant.models import StreamRecord
from tests.assistant.faults_support import kinds, metric
from tests.support import ChatClient, LiveServer, RawResponse, raw_post, wait_for
from tests.support import page_visit as support_page_visit

pytestmark = pytest.mark.django_db(transaction=True)

SEATS, PER_ADDRESS, NEW_SESSIONS = 8, 6, 12
HANG = "[scripted hang=1] a question that never gets a word"
_addresses = itertools.count(10)


def new_address() -> str:
    """A loopback address no other test of this module has used (the limits count per address,
    per minute)."""
    return f"127.0.0.{next(_addresses)}"


@dataclass
class Front:
    """Where clients connect (Daphne itself, or nginx before it) and the Daphne behind."""

    name: str
    server: LiveServer
    daphne: LiveServer

    def rejections(self, reason: str) -> float:
        return metric(self.daphne, "ai_rejections_total", reason=reason)

    def given_up(self, reason: str) -> float:
        return metric(self.daphne, "ai_streams_given_up_total", reason=reason)


@pytest.fixture(scope="module")
def guarded(daphne_factory) -> LiveServer:
    return daphne_factory(
        CHATSITE_MAX_STREAMS=str(SEATS),
        CHATSITE_STREAMS_PER_ADDRESS=str(PER_ADDRESS),
        CHATSITE_NEW_SESSIONS_PER_MINUTE=str(NEW_SESSIONS),
        CHATSITE_RESUME_GRACE_S="30",
    )


@pytest.fixture(scope="module", params=["direct", "nginx"])
def front(request: pytest.FixtureRequest, guarded: LiveServer) -> Front:
    if request.param == "direct":
        return Front("direct", guarded, guarded)
    nginx = request.getfixturevalue("nginx_factory")("chatsite.conf", [guarded.port])
    return Front("nginx", nginx, guarded)


@pytest.fixture(scope="module")
def figures(output_dir: Path) -> Iterator[dict[str, Any]]:
    found: dict[str, Any] = {}
    yield found
    (output_dir / "abuse.json").write_text(json.dumps(found, indent=2) + "\n")


def page_visit(front: Front, source: str) -> dict[str, str] | None:
    """A first visit's cookies (a new session and a CSRF token); None when refused (429)."""
    visit = support_page_visit(front.server.port, source)
    if visit.status == 429:
        assert b"Too many new visitors" in visit.body and visit.retry_after is not None
        return None
    assert visit.status == 200, visit.status
    return visit.cookies


def ask(front: Front, cookies: dict[str, str], message: str, source: str) -> RawResponse:
    body = json.dumps({"message": message, "conversation": None}).encode()
    headers = {"Content-Type": "application/json", "X-CSRFToken": cookies["csrftoken"]}
    return raw_post(front.server.port, body, cookies=cookies, headers=headers, source=source)


def error_code(response: RawResponse) -> tuple[int, str]:
    try:
        return response.status, json.loads(response.body())["error"]["code"]
    finally:
        response.sock.close()


@dataclass
class Held:
    """A flood's stream that got in: its session and its open response."""

    cookies: dict[str, str]
    response: RawResponse
    request_id: str


def hold(front: Front, source: str, count: int) -> list[Held]:
    """``count`` never-ending answers from ``source``, each on a session of its own."""
    held = []
    for _ in range(count):
        cookies = page_visit(front, source)
        assert cookies is not None
        response = ask(front, cookies, HANG, source)
        assert response.status == 200, response.body()
        meta = next(e for e in response.events() if e.event == "meta")
        held.append(Held(cookies, response, meta.json()["request_id"]))
    return held


def stop_all(front: Front, held: list[Held], source: str) -> None:
    """End the flood's answers as their students would (Stop), so no seat outlives the test."""
    for stream in held:
        body = json.dumps({"request_id": stream.request_id}).encode()
        headers = {"Content-Type": "application/json", "X-CSRFToken": stream.cookies["csrftoken"]}
        stop = raw_post(
            front.server.port,
            body,
            cookies=stream.cookies,
            headers=headers,
            path="/api/chat/stop",
            source=source,
        )
        assert stop.status in (204, 404), stop.status  # 404: it had ended already
        stop.sock.close()
        stream.response.sock.close()


def student_answered(front: Front) -> list[str]:
    student = ChatClient(front.server, source=new_address())
    try:
        return kinds(student.ask("[scripted tokens=3 ttft_ms=0] What is a prime number?"))
    finally:
        student.close()


def test_streams_without_a_session_get_403_and_a_student_is_answered(
    front: Front, figures: dict[str, Any]
) -> None:
    flood = 120
    source = new_address()
    before = front.rejections("session_required")
    token = "f" * 32  # a CSRF cookie of the client's own making, with the header to match
    for i in range(flood):
        cookies = {"csrftoken": token}
        if i % 2:
            cookies["sessionid"] = f"forged{i:026d}"  # a session the site never issued
        response = ask(front, cookies, HANG, source)
        status, code = error_code(response)
        assert (status, code) == (403, "session_required")
    assert student_answered(front)[-1] == "done"
    assert front.rejections("session_required") - before == flood
    figures[f"{front.name}_sessionless_flood"] = flood


def test_a_flood_loading_the_page_before_each_stream_is_held_to_its_address_limits(
    front: Front, figures: dict[str, Any]
) -> None:
    attempts = 2 * NEW_SESSIONS
    source = new_address()
    pages_before = front.rejections("new_sessions_limited")
    busy_before = front.rejections("address_busy")
    held: list[Held] = []
    pages_refused = streams_refused = 0
    try:
        for _ in range(attempts):
            cookies = page_visit(front, source)
            if cookies is None:
                pages_refused += 1
                continue
            response = ask(front, cookies, HANG, source)
            if response.status == 200:
                meta = next(e for e in response.events() if e.event == "meta")
                held.append(Held(cookies, response, meta.json()["request_id"]))
            else:
                assert error_code(response) == (429, "address_busy")
                streams_refused += 1
        assert len(held) == PER_ADDRESS
        assert pages_refused >= 1 and streams_refused >= 1
        assert student_answered(front)[-1] == "done"
    finally:
        stop_all(front, held, source)
    assert front.rejections("new_sessions_limited") - pages_before == pages_refused
    assert front.rejections("address_busy") - busy_before == streams_refused
    figures[f"{front.name}_page_load_flood"] = {
        "attempts": attempts,
        "streams_held": len(held),
        "pages_refused": pages_refused,
        "streams_refused": streams_refused,
    }


def test_at_the_cap_the_address_over_its_share_gives_up_its_newest_answer(
    front: Front, figures: dict[str, Any]
) -> None:
    heavy, light = new_address(), new_address()
    before = front.given_up("fair_share")
    held = hold(front, heavy, PER_ADDRESS)
    held_light = hold(front, light, SEATS - PER_ADDRESS)  # every seat is taken now
    try:
        assert student_answered(front)[-1] == "done"
        newest = held[-1]
        rest = [e for e in newest.response.events() if e.event == "error"]
        assert [e.json()["code"] for e in rest] == ["fair_share"]
        assert "let another student in" in rest[0].json()["message"]
        record = wait_for(lambda: StreamRecord.objects.filter(request_id=newest.request_id).first())
        assert (record.outcome, record.error_code) == ("given_up", "fair_share")
        assert front.given_up("fair_share") - before == 1
    finally:
        stop_all(front, held, heavy)
        stop_all(front, held_light, light)
    figures[f"{front.name}_fair_share"] = {"seats": SEATS, "heavy_address_held": PER_ADDRESS}


def test_a_student_is_admitted_at_once_after_a_flood_hangs_up(
    front: Front, figures: dict[str, Any]
) -> None:
    """Abandoned answers would run on for the resume grace (30 s); at the cap they give their
    seats up to the next request instead."""
    heavy, light = new_address(), new_address()
    before = front.given_up("unheard")
    held = hold(front, heavy, PER_ADDRESS) + hold(front, light, SEATS - PER_ADDRESS)
    try:
        for stream in held:
            stream.response.sock.close()
        hung_up = time.monotonic()
        time.sleep(0.5)  # the student asks half a second after the flood hung up
        asked = time.monotonic()
        assert student_answered(front)[-1] == "done"  # on the first try
        answered = time.monotonic()
        assert front.given_up("unheard") - before == 1
    finally:
        stop_all(front, held[:PER_ADDRESS], heavy)
        stop_all(front, held[PER_ADDRESS:], light)
    figures[f"{front.name}_hang_up"] = {
        "flood": len(held),
        "asked_after_hang_up_ms": round((asked - hung_up) * 1000, 1),
        "answered_in_ms": round((answered - asked) * 1000, 1),
    }
