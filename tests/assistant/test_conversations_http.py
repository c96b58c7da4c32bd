"""Conversations over HTTP: saved, continued with their history, private to their owner."""

import json

import httpx
import pytest
from django.db import connection

from assistant.engines.scripted import default_tokens
from assistant.loop_redis import LOOP_CLIENT_NAME
from assistant.models import Conversation, Message
from assistant.services.identity import session_pseudonym
from tests.support import REDIS_URL, ChatClient, LiveServer, raw_post, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def answer_saved(message_id: str) -> Message:
    return wait_for(lambda: Message.objects.filter(id=message_id).first())


def test_question_and_complete_answer_are_saved(chat_client: ChatClient) -> None:
    events = chat_client.ask("[scripted tokens=4] What is photosynthesis?")
    meta = events[0].json()
    answer = answer_saved(meta["message"])
    assert answer.status == "complete"
    assert answer.content == "".join(default_tokens(4))
    assert answer.finish_reason == "stop"
    question = Message.objects.get(id=meta["user_message"])
    assert question.content == "[scripted tokens=4] What is photosynthesis?"
    assert question.conversation_id == answer.conversation_id
    conversation = Conversation.objects.get(id=meta["conversation"])
    assert conversation.title == "[scripted tokens=4] What is photosynthesis?"
    assert conversation.owner_key.startswith("session:")


def test_continuing_a_conversation_sends_its_history(
    chat_client: ChatClient, daphne: LiveServer
) -> None:
    first = chat_client.ask("[scripted tokens=3 tag=first] one")
    conversation = first[0].json()["conversation"]
    answer_saved(first[0].json()["message"])
    second = chat_client.ask("[scripted tokens=3 tag=second] two", conversation=conversation)
    assert second[0].json()["conversation"] == conversation
    # system prompt + first question + first answer + the new question
    assert daphne.wait_engine_event("second", "start")["messages"] == 4
    answer_saved(second[0].json()["message"])
    history = chat_client.client.get(f"/api/conversations/{conversation}").json()["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[2]["content"] == "[scripted tokens=3 tag=second] two"


#: The writer's interval in the follow-up tests: far beyond a follow-up's wait for rows it
#: cannot do without (``conversations.WRITTEN_WAIT_S``) and an exchange's time.
LATE_WRITER = {"CHATSITE_PERSIST_BATCH_MS": "10000", "CHATSITE_PERSIST_BATCH_FROM": "0"}


def follow_up_before_stored(worker: LiveServer, client: ChatClient, tag: str) -> str:
    """A question, then a follow-up asked the moment its answer's ``done`` arrives, while the
    worker's writer (``LATE_WRITER``: a batch at most every 10 s, however few answers run) still
    holds the answer: the engine gets it in the history all the same, from what the writer
    holds (``conversations.history_held``), not by waiting for it to be stored. The first
    question (with its new conversation, which a follow-up must find stored) is the writer's
    first batch, written at once. Returns the conversation."""
    first = client.ask(f"[scripted tokens=3 tag={tag}-first] one")
    meta = first[0].json()
    assert first[-1].event == "done"
    wait_for(lambda: Message.objects.filter(id=meta["user_message"]).exists())
    second = client.ask(f"[scripted tokens=3 tag={tag}-second] two", meta["conversation"])
    assert second[-1].event == "done"
    assert not Message.objects.filter(id=meta["message"]).exists()  # the writer holds it
    # system prompt + first question + first answer + the new question
    given = worker.wait_engine_event(f"{tag}-second", "start")["given"]
    assert [role for role, _ in given] == ["system", "user", "assistant", "user"]
    assert given[2][1] == "".join(default_tokens(3))
    return meta["conversation"]


def test_a_follow_up_asked_as_the_answer_ends_has_it_in_its_history(daphne_factory) -> None:
    worker = daphne_factory(**LATE_WRITER)
    client = ChatClient(worker)
    try:
        follow_up_before_stored(worker, client, "late")
    finally:
        client.close()


def test_another_session_cannot_read_or_continue_a_conversation(
    chat_client: ChatClient, daphne: LiveServer
) -> None:
    events = chat_client.ask("[scripted tokens=2] private question")
    conversation = events[0].json()["conversation"]
    answer_saved(events[0].json()["message"])

    intruder = ChatClient(daphne)
    try:
        response = intruder.raw({"message": "let me in", "conversation": conversation})
        assert response.status == 404
        assert intruder.client.get(f"/api/conversations/{conversation}").status_code == 404
        assert intruder.client.get("/api/conversations").json() == {"conversations": []}
    finally:
        intruder.close()
    mine = chat_client.client.get("/api/conversations").json()["conversations"]
    assert [c["id"] for c in mine] == [conversation]


@pytest.mark.parametrize("path", ["direct", "django"])
@pytest.mark.parametrize("session", [None, "expired0000000000000000000000000"])
def test_a_stream_without_a_live_session_is_refused_until_the_page_renews_it(
    chat_client: ChatClient, path: str, session: str | None
) -> None:
    """No session, or one the site does not know: 403 ``session_required``, no new session, and
    nothing stored. ``POST /api/session`` (what the page does then) issues one that streams."""
    cookies = {"csrftoken": chat_client.csrf_token}
    if session is not None:
        cookies["sessionid"] = session
    headers = {"Content-Type": "application/json", "X-CSRFToken": chat_client.csrf_token}
    url = f"/api/chat/stream/{path}"
    body = b'{"message": "[scripted tokens=1] hello"}'
    response = raw_post(chat_client.server.port, body, cookies=cookies, headers=headers, path=url)
    assert response.status == 403
    assert response.header("set-cookie") is None
    error = json.loads(response.body())["error"]
    assert error["code"] == "session_required" and "Reload the page" in error["message"]
    assert not Conversation.objects.exists()

    csrf = {"csrftoken": chat_client.csrf_token}
    renewed = httpx.Client(base_url=chat_client.server.url, cookies=csrf)
    try:
        issued = renewed.post("/api/session", headers={"X-CSRFToken": chat_client.csrf_token})
        assert issued.status_code == 204
        session_key = renewed.cookies["sessionid"]
        assert session_key != session
        answer = raw_post(
            chat_client.server.port,
            body,
            cookies={**cookies, "sessionid": session_key},
            headers=headers,
            path=url,
        )
        assert answer.status == 200
        meta = next(answer.events()).json()
    finally:
        renewed.close()
    conversation = wait_for(lambda: Conversation.objects.filter(id=meta["conversation"]).first())
    assert conversation.owner_key == f"session:{session_pseudonym(session_key)}"


def loop_reads_seen(pid: int) -> list[str]:
    """The last query of each connection the worker ``pid``'s event loop opened to PostgreSQL
    (``assistant/loop_postgres.py``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = %s",
            [f"{LOOP_CLIENT_NAME}-{pid}"],
        )
        return [query for (query,) in cursor.fetchall()]


@pytest.mark.parametrize(("server_kind", "on_loop"), [("daphne", False), ("uvicorn", True)])
def test_a_follow_up_on_the_production_profile(
    worker_factory, server_kind: str, on_loop: bool, redis_prefix: str
) -> None:
    """On Redis, with the writer holding what was said: a follow-up asked the moment ``done``
    arrives has the first answer in its history, and another session's is refused.
    Under uvicorn on PostgreSQL the history is read by the worker's event loop's own connection
    (``services/loop_admission.py``); under Daphne, and on SQLite, on a reader thread."""
    worker = worker_factory(
        CHATSITE_REDIS_URL=REDIS_URL,
        CHATSITE_REDIS_PREFIX=redis_prefix,
        CHATSITE_CHAT_RATE="1000",
        **LATE_WRITER,
    )
    client, intruder = ChatClient(worker), ChatClient(worker)
    try:
        conversation = follow_up_before_stored(worker, client, f"prod-{server_kind}")
        refused = intruder.raw({"message": "let me in", "conversation": conversation})
        assert refused.status == 404
        seen = loop_reads_seen(worker.process.pid) if connection.vendor == "postgresql" else []
    finally:
        client.close()
        intruder.close()
    if connection.vendor == "postgresql":
        assert len(seen) == int(on_loop), seen
        assert all("LEFT JOIN LATERAL" in query for query in seen), seen
