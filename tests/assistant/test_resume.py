"""Resuming an answer after a network drop, over real HTTP on both serving paths."""

import json
import time

import httpx
import pytest

from assistant.engines.scripted import default_tokens
from assistant.models import Message
from tests.support import ChatClient, Event, LiveServer, SSEReader, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

GRACE_S = 1.5


@pytest.fixture(scope="module")
def server(daphne_factory) -> LiveServer:
    return daphne_factory(CHATSITE_RESUME_GRACE_S=str(GRACE_S), CHATSITE_RESUME_KEEP_S="5")


@pytest.fixture(params=["direct", "django"])
def path(request: pytest.FixtureRequest) -> str:
    return request.param


def read_then_drop(client: ChatClient, path: str, message: str, tokens: int) -> list[Event]:
    """Start an answer, read ``tokens`` tokens, then drop the connection."""
    response = client.raw({"message": message}, path=f"/api/chat/stream/{path}")
    events: list[Event] = []
    for event in response.events():
        events.append(event)
        if sum(e.event == "token" for e in events) == tokens:
            break
    response.sock.close()
    return events


def resume(client: ChatClient, request_id: str, last_id: int) -> httpx.Response:
    return client.client.post(
        "/api/chat/resume",
        json={"request_id": request_id},
        headers={"X-CSRFToken": client.csrf_token, "Last-Event-ID": str(last_id)},
    )


def resumed_events(client: ChatClient, request_id: str, last_id: int) -> list[Event]:
    reader = SSEReader()
    headers = {"X-CSRFToken": client.csrf_token, "Last-Event-ID": str(last_id)}
    body = {"request_id": request_id}
    with client.client.stream("POST", "/api/chat/resume", json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()
        return [e for chunk in response.iter_raw() for e in reader.feed(chunk)]


def test_a_dropped_answer_resumes_with_exactly_the_missing_tokens(
    server: LiveServer, transactional_db, path: str
) -> None:
    client = ChatClient(server)
    try:
        before = read_then_drop(client, path, "[scripted tokens=30 itl_ms=40] Go on", 5)
        request_id = before[0].json()["request_id"]
        time.sleep(0.3)  # the page notices, waits a moment, reconnects
        started = time.monotonic()
        after = resumed_events(client, request_id, last_id=5)
        first_token_after = next(e for e in after if e.event == "token").at - started
    finally:
        client.close()
    assert [e.event for e in after[:1]] == ["meta"]
    assert after[0].json()["request_id"] == request_id
    ids = [int(e.id) for e in after if e.event == "token"]
    assert ids == list(range(6, 31))
    assert after[-1].event == "done"
    text = "".join(e.json()["text"] for e in [*before, *after] if e.event == "token")
    assert text == "".join(default_tokens(30))
    # The tokens made while nobody listened were waiting in the buffer: they come at once.
    assert first_token_after < 0.5, first_token_after
    answer = wait_for(
        lambda: Message.objects.filter(request_id=request_id, role="assistant").first()
    )
    assert (answer.status, answer.content) == ("complete", text)


def test_nobody_resuming_stops_the_answer_after_the_grace_period(
    server: LiveServer, transactional_db, path: str
) -> None:
    client = ChatClient(server)
    tag = f"gone-{path}"
    try:
        before = read_then_drop(client, path, f"[scripted tokens=200 itl_ms=40 tag={tag}] x", 3)
        dropped = time.monotonic()
        cancel = server.wait_engine_event(tag, "cancel", timeout=GRACE_S + 3)
        request_id = before[0].json()["request_id"]
        assert GRACE_S - 0.2 <= cancel["t"] - dropped < GRACE_S + 1
        answer = wait_for(
            lambda: Message.objects.filter(request_id=request_id, role="assistant").first()
        )
        refused = resume(client, request_id, last_id=3)
    finally:
        client.close()
    assert answer.status == "partial"
    assert refused.status_code == 404
    payload = refused.json()
    assert payload["error"]["code"] == "stream_expired"
    assert payload["answer"]["status"] == "partial"
    assert payload["answer"]["content"] == answer.content


def test_an_answer_finished_while_away_is_still_delivered(
    server: LiveServer, transactional_db, path: str
) -> None:
    client = ChatClient(server)
    try:
        before = read_then_drop(client, path, "[scripted tokens=6 itl_ms=30] short", 2)
        time.sleep(0.5)  # the rest is generated (and done) meanwhile
        after = resumed_events(client, before[0].json()["request_id"], last_id=2)
    finally:
        client.close()
    assert [int(e.id) for e in after if e.event == "token"] == [3, 4, 5, 6]
    assert after[-1].event == "done"


def test_another_session_cannot_resume_or_see_the_answer(
    server: LiveServer, transactional_db, path: str
) -> None:
    owner, intruder = ChatClient(server), ChatClient(server)
    try:
        before = read_then_drop(owner, path, "[scripted tokens=20 itl_ms=40] mine", 2)
        refused = resume(intruder, before[0].json()["request_id"], last_id=0)
    finally:
        owner.close()
        intruder.close()
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "stream_expired"
    assert refused.json()["answer"] is None


def test_a_new_question_replaces_an_answer_left_behind(
    server: LiveServer, transactional_db, path: str
) -> None:
    """One stream per session: a student who moved on is not told to wait for the old one."""
    client = ChatClient(server)
    tag = f"replaced-{path}"
    try:
        read_then_drop(client, path, f"[scripted tokens=200 itl_ms=40 tag={tag}] first", 2)
        time.sleep(0.1)
        events = client.ask("[scripted tokens=2 ttft_ms=0] second", url=f"/api/chat/stream/{path}")
        cancel = server.wait_engine_event(tag, "cancel", timeout=2)
    finally:
        client.close()
    assert events[-1].event == "done"
    assert cancel["tokens"] < 200


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        ({}, {}, 400, "resume_invalid"),
        ({"request_id": 7}, {}, 400, "resume_invalid"),
        ({"request_id": "abcdefgh12"}, {"Last-Event-ID": "x"}, 400, "resume_invalid"),
        ({"request_id": "abcdefgh12"}, {"Last-Event-ID": "-1"}, 400, "resume_invalid"),
        ({"request_id": "abcdefgh12"}, {}, 404, "stream_expired"),
    ],
)
def test_bad_resumes_get_clear_errors(
    server: LiveServer, transactional_db, body: dict, headers: dict, status: int, code: str
) -> None:
    client = ChatClient(server)
    try:
        response = client.client.post(
            "/api/chat/resume",
            content=json.dumps(body),
            headers={
                "X-CSRFToken": client.csrf_token,
                "Content-Type": "application/json",
                **headers,
            },
        )
        no_token = client.client.post("/api/chat/resume", json={"request_id": "abcdefgh12"})
    finally:
        client.close()
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    assert no_token.status_code == 403
