"""Stop means stop: ``POST /api/chat/stop`` ends an answer at once although a dropped connection
would be resumed, and an unheard answer gives the embedded model up to a student who waits.

Real Daphne servers with a 30 s resume grace (the default), real HTTP clients; the scripted
engine for the protocol, the real SmolLM2 for the engine's queue. Bounds on time are sanity
bounds: before this, the next student waited through the whole grace (9.5 s measured).
"""

import time
from collections.abc import Iterator
from contextlib import closing

import httpx
import pytest

from assistant.models import Message
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "[scripted tokens=400 itl_ms=40 tag={tag}] Tell me all about plants."


@pytest.fixture(scope="module")
def grace_server(daphne_factory) -> LiveServer:
    return daphne_factory(CHATSITE_RESUME_GRACE_S="30")


def stop(client: ChatClient, request_id: str) -> httpx.Response:
    headers = {"X-CSRFToken": client.csrf_token}
    return client.client.post("/api/chat/stop", json={"request_id": request_id}, headers=headers)


@pytest.mark.parametrize("path", ["direct", "django"])
def test_stop_ends_a_streaming_answer_and_keeps_what_was_said(
    grace_server: LiveServer, path: str
) -> None:
    """Stop after 3 tokens while still reading: 204, the stream closes without `done`, the
    engine is cancelled, and the 3+ tokens are stored as a partial answer."""
    client = ChatClient(grace_server)
    tag = f"stop-{path}"
    received = []
    response = None
    started = time.monotonic()
    for event in client.stream(LONG.format(tag=tag), url=f"/api/chat/stream/{path}"):
        received.append(event)
        if sum(e.event == "token" for e in received) == 3 and response is None:
            response = stop(client, received[0].json()["request_id"])
    ended = time.monotonic()
    client.close()

    assert response is not None and response.status_code == 204, response
    assert "done" not in [e.event for e in received]
    cancel = grace_server.wait_engine_event(tag, "cancel")
    assert cancel["tokens"] < 400
    assert ended - started < 10, "the stream went on after Stop"
    message = wait_for(lambda: Message.objects.filter(id=received[0].json()["message"]).first())
    assert message.status == Message.Status.PARTIAL
    tokens = "".join(e.json()["text"] for e in received if e.event == "token")
    assert message.content.startswith(tokens) and len(tokens) > 0


def test_stop_after_the_connection_dropped_ends_the_grace(grace_server: LiveServer) -> None:
    """The page aborted first (its connection is gone, the answer goes on for a resume): the
    stop request still finds it and the engine is cancelled at once, not after 30 s."""
    client = ChatClient(grace_server)
    tag = "stop-after-drop"
    # Read the meta event, then close the connection, as a page that aborts does.
    with closing(client.stream(LONG.format(tag=tag))) as events:
        request_id = next(events).json()["request_id"]
    grace_server.wait_engine_event(tag, "start")
    time.sleep(0.3)  # still generating into the resume buffer
    assert not [e for e in grace_server.engine_events(tag) if e["event"] == "cancel"]

    asked = time.monotonic()
    response = stop(client, request_id)
    cancel = grace_server.wait_engine_event(tag, "cancel", timeout=5)
    client.close()

    assert response.status_code == 204
    assert cancel["t"] - asked < 2


def test_nobody_else_can_stop_an_answer(grace_server: LiveServer) -> None:
    """Another session's stop request for the same id is 404 and the answer goes on."""
    owner, other = ChatClient(grace_server), ChatClient(grace_server)
    tag = "stop-by-other"
    events = []
    refused = None
    for event in owner.stream(
        f"[scripted tokens=12 itl_ms=20 tag={tag}] Hi", url="/api/chat/stream/direct"
    ):
        events.append(event)
        if event.event == "meta":
            refused = stop(other, event.json()["request_id"])
    owner.close()
    other.close()

    assert refused is not None and refused.status_code == 404
    assert refused.json()["error"]["code"] == "stop_unknown"
    assert events[-1].event == "done"


def test_bad_stop_requests_get_a_clear_4xx(grace_server: LiveServer) -> None:
    """Bad JSON or id: 400 stop_invalid; GET: 405; no CSRF token: 403; unknown id: 404."""
    client = ChatClient(grace_server)
    token = {"X-CSRFToken": client.csrf_token}
    try:
        bad_json = client.client.post("/api/chat/stop", content=b"{", headers=token)
        bad_id = client.client.post("/api/chat/stop", json={"request_id": "x y"}, headers=token)
        get = client.client.get("/api/chat/stop")
        no_token = client.client.post("/api/chat/stop", json={"request_id": "a" * 32})
        unknown = stop(client, "b" * 32)
    finally:
        client.close()

    assert (bad_json.status_code, bad_json.json()["error"]["code"]) == (400, "stop_invalid")
    assert (bad_id.status_code, bad_id.json()["error"]["code"]) == (400, "stop_invalid")
    assert get.status_code == 405
    assert (no_token.status_code, no_token.json()["error"]["code"]) == (403, "csrf_failed")
    assert unknown.status_code == 404


# --- the real embedded model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_server(daphne_factory) -> Iterator[LiveServer]:
    yield daphne_factory(CHATSITE_ENGINE="llamacpp", CHATSITE_RESUME_GRACE_S="30")


def first_token_s(server: LiveServer, question: str) -> float:
    """Seconds from sending ``question`` (a new session) to its first token."""
    client = ChatClient(server)
    try:
        sent = time.monotonic()
        for event in client.stream(question):
            if event.event == "token":
                return time.monotonic() - sent
    finally:
        client.close()
    raise AssertionError("no token")


def abandon_a_long_answer(server: LiveServer, *, press_stop: bool) -> None:
    """Student A asks for a long answer, takes 3 tokens and leaves, with or without Stop."""
    client = ChatClient(server)
    tokens = 0
    request_id = ""
    with closing(client.stream("Write a very long story about a dragon.")) as events:
        for event in events:
            if event.event == "meta":
                request_id = event.json()["request_id"]
            tokens += event.event == "token"
            if tokens == 3:
                if press_stop:
                    assert stop(client, request_id).status_code == 204
                break
    client.close()


@pytest.mark.model
@pytest.mark.parametrize("press_stop", [True, False], ids=["stop", "drop"])
def test_an_abandoned_answer_gives_the_model_to_the_next_student(
    model_server: LiveServer, press_stop: bool
) -> None:
    """After A stops (or just drops) a long answer, B's first token comes within 0.5 s of its
    first token on an idle model, not after A's answer or A's grace."""
    question = "What is 2+2?"
    first_token_s(model_server, question)  # load and warm up
    idle = min(first_token_s(model_server, question) for _ in range(2))

    abandon_a_long_answer(model_server, press_stop=press_stop)
    after = first_token_s(model_server, question)

    print(f"B's first token: {idle * 1000:.0f} ms idle, {after * 1000:.0f} ms after A left")
    assert after < idle + 0.5, f"B waited {after:.2f} s after A left; {idle:.2f} s when idle"
