"""Editing a question and asking for an answer again (``"replaces"`` in the stream request), on
both serving paths against a real Daphne: the new question and answer take the old ones' place
on the page and in what the model is given; the old ones stay stored, set aside."""

import json
from typing import Any

import pytest

from assistant.models import Conversation, Message
from assistant.services.persistence import Rows, rows_write
from tests.support import ChatClient, LiveServer, SSEReader, row_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["direct", "django"])
def url(request: pytest.FixtureRequest) -> str:
    return f"/api/chat/stream/{request.param}"


def ask(client: ChatClient, url: str, **body: Any) -> dict[str, Any]:
    """Ask, read the whole answer, wait until it is stored; the ``meta`` event's data."""
    response = client.post_stream({"conversation": None, **body}, url=url)
    assert response.status_code == 200, response.text
    events = list(SSEReader().feed(response.content))
    assert events[-1].event == "done", events[-1]
    meta = events[0].json()
    wait_for(lambda: Message.objects.filter(id=meta["message"]).exists())
    return meta


def shown(client: ChatClient, conversation: str) -> list[tuple[str, str]]:
    messages = client.client.get(f"/api/conversations/{conversation}").json()["messages"]
    return [(m["role"], m["content"]) for m in messages]


def test_an_edited_question_replaces_it_and_what_followed(
    chat_client: ChatClient, daphne: LiveServer, url: str
) -> None:
    """Editing the first of two questions: the page shows the edited question and its answer
    only, the model is given nothing of the old branch, and the four old messages stay stored,
    marked replaced."""
    first = ask(chat_client, url, message="[scripted tokens=2 tag=e1] one")
    conversation = first["conversation"]
    ask(chat_client, url, message="[scripted tokens=2 tag=e2] two", conversation=conversation)
    edited = ask(
        chat_client,
        url,
        message="[scripted tokens=3 tag=e3] one, better",
        conversation=conversation,
        replaces=first["user_message"],
    )
    assert edited["conversation"] == conversation
    assert shown(chat_client, conversation) == [
        ("user", "[scripted tokens=3 tag=e3] one, better"),
        ("assistant", " ".join(["Photosynthesis", "turns", "light,"])),
    ]
    given = daphne.wait_engine_event("e3", "start")["given"]
    assert [content for _, content in given if "scripted" in content] == [
        "[scripted tokens=3 tag=e3] one, better"
    ]
    stored = Message.objects.filter(conversation_id=conversation)
    assert stored.count() == 6
    assert stored.filter(replaced_at__isnull=False).count() == 4


def test_asking_again_replaces_only_the_last_answer(
    chat_client: ChatClient, daphne: LiveServer, url: str
) -> None:
    """Regenerating the last answer (the same question, replacing itself) keeps the earlier
    exchange in the page and in what the model is given."""
    first = ask(chat_client, url, message="[scripted tokens=2 tag=r1] one")
    conversation = first["conversation"]
    second = ask(
        chat_client, url, message="[scripted tokens=2 tag=r2] two", conversation=conversation
    )
    ask(
        chat_client,
        url,
        message="[scripted tokens=4 tag=r3] two",
        conversation=conversation,
        replaces=second["user_message"],
    )
    assert [role for role, _ in shown(chat_client, conversation)] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert shown(chat_client, conversation)[2][1] == "[scripted tokens=4 tag=r3] two"
    given = [content for _, content in daphne.wait_engine_event("r3", "start")["given"]]
    assert "[scripted tokens=2 tag=r1] one" in given
    assert "[scripted tokens=2 tag=r2] two" not in given
    assert Message.objects.filter(id=second["message"], replaced_at__isnull=False).exists()


def error_of(client: ChatClient, url: str, body: dict[str, Any]) -> tuple[int, str]:
    response = client.raw(body, path=url)
    payload = json.loads(response.body())
    return response.status, payload["error"]["code"]


def test_replacing_what_cannot_be_replaced_is_refused(
    chat_client: ChatClient, daphne: LiveServer, url: str
) -> None:
    """``replaces`` must name a question of the conversation that is still shown: an answer's id,
    another conversation's question, a malformed id or a question replaced already get a 4xx
    with its code, and nothing is stored or set aside."""
    first = ask(chat_client, url, message="[scripted tokens=2] one")
    other = ask(chat_client, url, message="[scripted tokens=2] elsewhere")
    conversation = first["conversation"]
    body = {"message": "again", "conversation": conversation}
    assert error_of(chat_client, url, {**body, "replaces": first["message"]}) == (
        400,
        "invalid_replaces",
    )
    assert error_of(chat_client, url, {**body, "replaces": other["user_message"]}) == (
        400,
        "invalid_replaces",
    )
    assert error_of(chat_client, url, {**body, "replaces": "not-a-uuid"}) == (
        400,
        "invalid_replaces",
    )
    assert error_of(chat_client, url, {"message": "x", "replaces": first["user_message"]}) == (
        400,
        "invalid_replaces",
    )
    assert Message.objects.filter(conversation_id=conversation).count() == 2
    assert not Message.objects.filter(replaced_at__isnull=False).exists()

    ask(
        chat_client,
        url,
        message="[scripted tokens=2] one again",
        conversation=conversation,
        replaces=first["user_message"],
    )
    assert error_of(chat_client, url, {**body, "replaces": first["user_message"]}) == (
        409,
        "question_replaced",
    )


def test_another_session_cannot_replace_a_question(
    chat_client: ChatClient, daphne: LiveServer, url: str
) -> None:
    """Somebody else's conversation stays a 404, ``replaces`` or not, and nothing changes."""
    first = ask(chat_client, url, message="[scripted tokens=2] mine")
    intruder = ChatClient(daphne)
    try:
        body = {
            "message": "theirs",
            "conversation": first["conversation"],
            "replaces": first["user_message"],
        }
        assert error_of(intruder, url, body) == (404, "conversation_not_found")
    finally:
        intruder.close()
    assert not Message.objects.filter(replaced_at__isnull=False).exists()


def test_an_answer_stored_with_its_replacement_is_set_aside_too() -> None:
    """A stopped answer whose rows reach the writer in the same batch as the question that
    replaces it (Stop, then Ask again at once) is set aside with its question; the replacement
    is not."""
    conversation = Conversation.objects.create(owner_key="owner", title="t")
    first = Message.objects.create(conversation=conversation, role="user", content="one")
    late_answer = Message(conversation=conversation, role="assistant", content="partial")
    replacement = Message(conversation=conversation, role="user", content="one, again")
    rows_write(
        [
            Rows(messages=[row_of(late_answer)]),
            Rows(
                messages=[row_of(replacement)],
                replaced=[(conversation.id, first.id, replacement.id)],
            ),
        ]
    )
    shown = Message.objects.filter(conversation=conversation, replaced_at__isnull=True)
    assert [m.content for m in shown] == ["one, again"]
    assert Message.objects.filter(replaced_at__isnull=False).count() == 2
