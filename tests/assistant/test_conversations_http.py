"""Conversations over HTTP: saved, continued with their history, private to their owner."""

import pytest

from assistant.engines.scripted import default_tokens
from assistant.models import Conversation, Message
from tests.support import ChatClient, LiveServer, raw_post, wait_for

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


def test_a_stream_without_a_session_gets_one(chat_client: ChatClient) -> None:
    """A client with a CSRF cookie but no (or an expired) session gets a fresh session cookie,
    and the conversation belongs to it."""
    cookies = {"csrftoken": chat_client.csrf_token, "sessionid": "expired0000000000000000000000000"}
    response = raw_post(
        chat_client.server.port,
        b'{"message": "[scripted tokens=1] hello"}',
        cookies=cookies,
        headers={"Content-Type": "application/json", "X-CSRFToken": chat_client.csrf_token},
    )
    assert response.status == 200
    set_cookie = response.header("set-cookie")
    assert set_cookie is not None and set_cookie.startswith("sessionid=")
    assert "HttpOnly" in set_cookie
    session_key = set_cookie.split(";")[0].split("=", 1)[1]
    assert session_key != cookies["sessionid"]
    meta = next(response.events()).json()
    conversation = wait_for(lambda: Conversation.objects.filter(id=meta["conversation"]).first())
    assert conversation.owner_key == f"session:{session_key}"
