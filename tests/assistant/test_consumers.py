"""The stream endpoint over real HTTP against Daphne on loopback (scripted engine), on both
serving paths: every behaviour here is the protocol, whichever transport carries it."""

import itertools
import json
import time
import uuid

import pytest

from assistant.benchmarking import SSEEvent, SSEParser
from assistant.engines.scripted import default_tokens
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["direct", "django"])
def path(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def url(path: str) -> str:
    return f"/api/chat/stream/{path}"


def test_headers_say_event_stream_and_forbid_buffering(chat_client: ChatClient, url: str) -> None:
    """The response is an uncompressed, unbuffered, open-ended event stream."""
    response = chat_client.raw(
        {"message": "[scripted tokens=2]", "conversation": None},
        headers={"Accept-Encoding": "gzip, br", "X-Request-Id": f"req-{url[-6:]}-abcdef12"},
        path=url,
    )
    assert response.status == 200
    assert response.header("content-type") == "text/event-stream; charset=utf-8"
    assert response.header("cache-control") == "no-cache, no-transform"
    assert response.header("x-accel-buffering") == "no"
    assert response.header("x-request-id") == f"req-{url[-6:]}-abcdef12"
    assert response.header("content-length") is None
    assert response.header("content-encoding") is None
    # Chunked framing chosen once, by the server, not by the application.
    assert response.header_count("transfer-encoding") == 1
    events = list(response.events())
    assert events[0].json()["request_id"] == f"req-{url[-6:]}-abcdef12"


def test_event_sequence_is_open_meta_tokens_done(
    chat_client: ChatClient, path: str, url: str
) -> None:
    """`: open` comes first, then meta, one numbered token per delta, and done with timings."""
    response = chat_client.raw({"message": "[scripted tokens=5]", "conversation": None}, path=url)
    chunks = [data for _, data in response.chunks()]
    # `: open` and meta in one chunk (one write), ahead of the first token.
    assert chunks[0].startswith(b": open\n\nevent: meta\n")
    assert chunks[0].count(b"\n\n") == 2
    body = b"".join(chunks)
    events = SSEParser().feed(body)
    assert [e.event for e in events] == ["meta", *["token"] * 5, "done"], events
    meta = json.loads(events[0].data)
    assert meta["path"] == path
    assert meta["engine"] == "scripted"
    assert set(meta) >= {"request_id", "conversation", "message", "user_message"}
    tokens = default_tokens(5)
    for n, (token, event) in enumerate(zip(tokens, events[1:6], strict=True), start=1):
        data = json.dumps({"text": token}, separators=(",", ":"))
        assert (event.id, event.data) == (str(n), data)
        # Field by field as the encoder writes a token, each frame whole.
        assert f"id: {n}\nevent: token\ndata: {data}\n\n".encode() in body
    payload = json.loads(events[6].data)
    assert payload["finish_reason"] == "stop"
    assert payload["tokens"] == 5
    timings = payload["timings"]
    assert 0 < timings["parsed"] <= timings["engine_submitted"] <= timings["first_token_sent"]
    assert timings["first_token_sent"] <= timings["finished"]
    # Nothing else: the open comment, meta, the tokens, done, one frame each.
    assert body.count(b"\n\n") == 8


def test_an_answer_is_stored_under_ids_in_the_order_they_were_made(
    chat_client: ChatClient, url: str
) -> None:
    """The conversation, the question and the answer (and the request id the server makes when
    none comes) are version 7 UUIDs, the later answer's of a later or the same millisecond: the
    indexes on them take each new row at their end."""
    metas = []
    for _ in range(2):
        response = chat_client.raw(
            {"message": "[scripted tokens=1]", "conversation": None}, path=url
        )
        metas.append(next(iter(response.events())).json())
    from assistant.models import Message

    made = [[uuid.UUID(meta[key]) for key in IDS] for meta in metas]
    assert {u.version for ids in made for u in ids} == {7}
    for earlier, later in zip(made[0], made[1], strict=True):
        assert earlier != later
        assert earlier.int >> 80 <= later.int >> 80
    for meta in metas:
        answer = wait_for(lambda meta=meta: Message.objects.filter(id=meta["message"]).first())
        assert answer.request_id == meta["request_id"]
        assert str(answer.conversation_id) == meta["conversation"]
        assert Message.objects.get(id=meta["user_message"]).role == "user"


#: The ids an answer's ``meta`` event names.
IDS = ("request_id", "conversation", "user_message", "message")


def test_each_token_is_sent_when_generated(chat_client: ChatClient, url: str) -> None:
    """Tokens 60 ms apart at the engine arrive about 60 ms apart, not in a burst."""
    response = chat_client.raw({"message": "[scripted tokens=10 itl_ms=60]"}, path=url)
    arrivals = [e.at for e in response.events() if e.event == "token"]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) == 10
    assert arrivals[-1] - arrivals[0] > 0.45
    assert sum(gap > 0.03 for gap in gaps) >= 8, gaps


def test_open_and_meta_arrive_before_the_engine_answers(chat_client: ChatClient, url: str) -> None:
    """The first bytes leave before the engine's first token (which takes 600 ms here)."""
    sent = time.monotonic()
    response = chat_client.raw({"message": "[scripted tokens=1 ttft_ms=600]"}, path=url)
    events = list(response.events())
    meta, token = events[0], events[1]
    assert meta.event == "meta" and token.event == "token"
    assert meta.at - sent < 0.4
    assert token.at - sent >= 0.6


def test_pings_keep_a_silent_stream_alive(daphne_factory, url: str) -> None:
    """With a 150 ms ping interval, a 700 ms wait for the first token carries pings."""
    server: LiveServer = daphne_factory(CHATSITE_PING_INTERVAL="0.15")
    client = ChatClient(server)
    response = client.raw({"message": "[scripted tokens=2 ttft_ms=700]"}, path=url)
    parser = SSEParser()
    events: list[SSEEvent] = []
    pings = 0
    for _, data in response.chunks():
        if not any(e.event == "token" for e in events):
            pings += data.count(b": ping\n\n")  # comments, which the parser passes over
        events += parser.feed(data)
    assert pings >= 3
    assert [e.event for e in events] == ["meta", "token", "token", "done"], events
    client.close()


def test_client_disconnect_cancels_the_engine_within_100ms(
    chat_client: ChatClient, daphne: LiveServer, path: str, url: str
) -> None:
    """Closing the socket mid-answer stops generation at once, and the partial answer is kept."""
    tag = f"disconnect-{path}"
    response = chat_client.raw({"message": f"[scripted tokens=200 itl_ms=20 tag={tag}]"}, path=url)
    received = []
    for event in response.events():
        if event.event == "token":
            received.append(event.json()["text"])
        if len(received) == 3:
            break
    closed_at = time.monotonic()
    response.sock.close()
    cancel = daphne.wait_engine_event(tag, "cancel")
    assert cancel["t"] - closed_at < 0.1
    assert 3 <= cancel["tokens"] < 20

    from assistant.models import Message

    answer = wait_for(
        lambda: (
            Message.objects.filter(role="assistant", content__startswith="".join(received))
            .exclude(status="complete")
            .first()
        )
    )
    assert answer.status == "partial"
    assert answer.finish_reason == "client_abort"
    question = Message.objects.get(role="user", conversation=answer.conversation)
    assert question.content.endswith(f"tag={tag}]")


def test_engine_failure_before_first_token_is_an_error_event(
    chat_client: ChatClient, url: str
) -> None:
    """Headers are out already, so the failure is an error event; the question is kept."""
    events = chat_client.ask("[scripted fail_after=0] keep me", url=url)
    assert [e.event for e in events] == ["meta", "error"]
    error = events[1].json()
    assert error["code"] == "engine_unavailable"
    assert "try again" in error["message"]

    from assistant.models import Message

    conversation = events[0].json()["conversation"]
    saved = wait_for(
        lambda: (
            list(Message.objects.filter(conversation_id=conversation).values_list("role", "status"))
            if Message.objects.filter(conversation_id=conversation, role="assistant").exists()
            else None
        )
    )
    assert saved == [("user", "complete"), ("assistant", "failed")]


def test_engine_failure_mid_answer_keeps_the_partial_answer(
    chat_client: ChatClient, url: str
) -> None:
    events = chat_client.ask("[scripted tokens=10 fail_after=3]", url=url)
    assert [e.event for e in events] == ["meta", "token", "token", "token", "error"]
    assert events[-1].json()["code"] == "engine_error"

    from assistant.models import Message

    message_id = events[0].json()["message"]
    answer = wait_for(lambda: Message.objects.filter(id=message_id).first())
    assert answer.status == "partial"
    assert answer.content == "".join(default_tokens(3))


def test_server_keeps_serving_after_a_disconnect(chat_client: ChatClient, url: str) -> None:
    response = chat_client.raw({"message": "[scripted tokens=100 itl_ms=20]"}, path=url)
    next(response.events())
    response.sock.close()
    events = chat_client.ask("[scripted tokens=3]", url=url)
    assert events[-1].event == "done"
