"""Renaming and deleting a conversation (``PATCH`` and ``DELETE /api/conversations/<id>``): its
owner only, with the page's CSRF token; anybody else learns nothing, not even that it exists.
Django's test client with CSRF checks on, and a real Daphne for an answer still streaming."""

import json
import uuid
from typing import Any

import pytest
from django.test import Client, override_settings

from assistant.models import Conversation, Message, StreamRecord
from assistant.services.identity import session_pseudonym
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NOT_FOUND = {"error": {"code": "conversation_not_found", "message": "No such conversation."}}


class Page:
    """A browser that opened the chat page: its session, and the CSRF token the page sends."""

    def __init__(self) -> None:
        self.client = Client(enforce_csrf_checks=True)
        assert self.client.get("/").status_code == 200
        self.token = self.client.cookies["csrftoken"].value

    @property
    def owner_key(self) -> str:
        return f"session:{session_pseudonym(self.client.session.session_key)}"

    def patch(self, conversation: Any, body: Any, **kwargs: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body)
        kwargs.setdefault("content_type", "application/json")
        kwargs.setdefault("headers", {"X-CSRFToken": self.token})
        return self.client.patch(f"/api/conversations/{conversation}", data, **kwargs)

    def delete(self, conversation: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("headers", {"X-CSRFToken": self.token})
        return self.client.delete(f"/api/conversations/{conversation}", **kwargs)

    def listed(self) -> list[dict[str, Any]]:
        return self.client.get("/api/conversations").json()["conversations"]


def conversation_of(page: Page, title: str = "Cells") -> Conversation:
    conversation = Conversation.objects.create(owner_key=page.owner_key, title=title)
    Message.objects.create(conversation=conversation, role="user", content="What is a cell?")
    Message.objects.create(conversation=conversation, role="assistant", content="A unit of life.")
    return conversation


def test_the_owner_renames_a_conversation() -> None:
    """The title is stored trimmed, answered back, and listed; the conversation keeps its place
    in the list (``updated_at`` unchanged) and its messages."""
    page = Page()
    conversation = conversation_of(page)
    before = Conversation.objects.get(id=conversation.id).updated_at

    response = page.patch(conversation.id, {"title": "  细胞 and   membranes\n"})
    assert response.status_code == 200
    assert response.json() == {"id": str(conversation.id), "title": "细胞 and   membranes"}
    stored = Conversation.objects.get(id=conversation.id)
    assert stored.title == "细胞 and   membranes"
    assert stored.updated_at == before
    assert [c["title"] for c in page.listed()] == ["细胞 and   membranes"]
    assert Message.objects.filter(conversation=conversation).count() == 2

    longest = "长" * 120
    response = page.patch(conversation.id, {"title": f" {longest} ", "other": 1})
    assert response.status_code == 200 and response.json()["title"] == longest
    assert Conversation.objects.get(id=conversation.id).title == longest


def test_the_owner_deletes_a_conversation_with_its_messages_and_keeps_the_telemetry() -> None:
    """204 with no body; the conversation and its messages are gone from the database, the list
    and the history API; its stream record stays (the dashboard counts it). Deleting it again:
    404. The owner's other conversations are untouched."""
    page = Page()
    conversation = conversation_of(page)
    other = conversation_of(page, "Other")
    record = StreamRecord.objects.create(
        request_id="req-deleted-1",
        created_at=conversation.created_at,
        owner_key=page.owner_key,
        path="direct",
        engine="scripted",
        outcome="ok",
        conversation_id=conversation.id,
        message_id=uuid.uuid4(),
        tokens=12,
    )

    response = page.delete(conversation.id)
    assert response.status_code == 204 and response.content == b""
    assert not Conversation.objects.filter(id=conversation.id).exists()
    assert not Message.objects.filter(conversation_id=conversation.id).exists()
    assert [c["id"] for c in page.listed()] == [str(other.id)]
    assert page.client.get(f"/api/conversations/{conversation.id}").json() == NOT_FOUND
    kept = StreamRecord.objects.get(id=record.id)
    assert (kept.conversation_id, kept.tokens, kept.outcome) == (conversation.id, 12, "ok")
    assert Message.objects.filter(conversation=other).count() == 2

    again = page.delete(conversation.id)
    assert again.status_code == 404 and again.json() == NOT_FOUND


def _another_session(owner: Page) -> Page:
    return Page()


def _no_session(owner: Page) -> Page:
    """A visitor with a valid CSRF token but no session (the page's session cookie dropped)."""
    visitor = Page()
    del visitor.client.cookies["sessionid"]
    return visitor


@pytest.mark.parametrize("method", ["PATCH", "DELETE"])
@pytest.mark.parametrize("who", ["another session", "no session", "the owner, unknown id"])
def test_nobody_else_can_rename_or_delete_and_learns_nothing(method: str, who: str) -> None:
    """Someone else's conversation, a visitor without a session, and an id that does not exist
    all get the very same 404 ``conversation_not_found``; the conversation is unchanged."""
    owner = Page()
    conversation = conversation_of(owner)
    if who == "the owner, unknown id":
        caller, target = owner, uuid.uuid4()
    else:
        caller = _another_session(owner) if who == "another session" else _no_session(owner)
        target = conversation.id
    if method == "PATCH":
        response = caller.patch(target, {"title": "Mine now"})
    else:
        response = caller.delete(target)
    assert response.status_code == 404
    assert response.json() == NOT_FOUND
    stored = Conversation.objects.get(id=conversation.id)
    assert stored.title == "Cells" and stored.owner_key == owner.owner_key
    assert Message.objects.filter(conversation=conversation).count() == 2
    assert [c["title"] for c in owner.listed()] == ["Cells"]


@pytest.mark.parametrize("method", ["PATCH", "DELETE"])
@pytest.mark.parametrize("token", [None, "x" * 32])
def test_without_the_pages_csrf_token_nothing_changes(method: str, token: str | None) -> None:
    """No X-CSRFToken header, or a wrong one: 403 ``csrf_failed`` from Django's CSRF middleware
    (JSON, as for every API), and the conversation is as it was."""
    page = Page()
    conversation = conversation_of(page)
    headers = {} if token is None else {"X-CSRFToken": token}
    if method == "PATCH":
        response = page.patch(conversation.id, {"title": "Hijacked"}, headers=headers)
    else:
        response = page.delete(conversation.id, headers=headers)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "csrf_failed"
    assert Conversation.objects.get(id=conversation.id).title == "Cells"
    assert Message.objects.filter(conversation=conversation).count() == 2


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        (b'{"title": ', "invalid_json", "not valid JSON"),
        (b"\xff\xfe", "invalid_json", "not valid JSON"),
        ([], "title_invalid", '{"title": "..."}'),
        ({}, "title_invalid", '{"title": "..."}'),
        ({"name": "Cells 2"}, "title_invalid", '{"title": "..."}'),
        ({"title": None}, "title_invalid", '{"title": "..."}'),
        ({"title": 42}, "title_invalid", '{"title": "..."}'),
        ({"title": ["Cells"]}, "title_invalid", '{"title": "..."}'),
        ({"title": ""}, "title_missing", "Type a title"),
        ({"title": " \t\n\u3000 "}, "title_missing", "Type a title"),
        ({"title": "x" * 121}, "title_too_long", "longer than 120 characters"),
        ({"title": "长" * 5000}, "title_too_long", "longer than 120 characters"),
        ({"title": "Cells\x00"}, "title_unreadable", "control characters"),
        ({"title": "Cells\x07 ring"}, "title_unreadable", "control characters"),
        ({"title": "two\nlines"}, "title_unreadable", "control characters"),
        ({"title": "esc\x1b[31mred"}, "title_unreadable", "control characters"),
        (b'{"title": "half \\ud800 pair"}', "title_unreadable", "control characters"),
    ],
)
def test_bad_titles_are_refused_with_a_code(body: Any, code: str, says: str) -> None:
    """400 with a code saying what is wrong; the title stays as it was."""
    page = Page()
    conversation = conversation_of(page)
    response = page.patch(conversation.id, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code and says in error["message"], error
    assert Conversation.objects.get(id=conversation.id).title == "Cells"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_rename_that_is_not_json_gets_415(content_type: str) -> None:
    """As the chat stream answers: 415 ``unsupported_media_type``, nothing renamed."""
    page = Page()
    conversation = conversation_of(page)
    response = page.patch(conversation.id, {"title": "Cells 2"}, content_type=content_type)
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert Conversation.objects.get(id=conversation.id).title == "Cells"


def test_a_body_over_the_limit_gets_413() -> None:
    page = Page()
    conversation = conversation_of(page)
    response = page.patch(conversation.id, {"title": "x" * 40_000})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("method", ["post", "put", "options"])
def test_other_methods_get_405_with_allow(method: str) -> None:
    """With a valid token (so CSRF is not what refuses them): 405, ``Allow: GET, PATCH,
    DELETE``, and a JSON error."""
    page = Page()
    conversation = conversation_of(page)
    response = getattr(page.client, method)(
        f"/api/conversations/{conversation.id}",
        b"{}",
        content_type="application/json",
        headers={"X-CSRFToken": page.token},
    )
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET, PATCH, DELETE"
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert Conversation.objects.filter(id=conversation.id).exists()


@pytest.mark.usefixtures("rate_clock_held")
def test_renames_and_deletes_are_rate_limited_per_owner() -> None:
    """At the chat rate (here 3 a minute), counted apart from questions: the fourth change in a
    minute gets 429 ``rate_limited`` with Retry-After and changes nothing; another student is
    not affected."""
    limits = {"beacon": (120, 60), "chat": (3, 60)}
    with override_settings(CHATSITE_RATE_LIMITS=limits):
        page = Page()
        first, second = conversation_of(page), conversation_of(page, "Atoms")
        assert page.patch(first.id, {"title": "one"}).status_code == 200
        assert page.patch(first.id, {"title": "two"}).status_code == 200
        assert page.delete(uuid.uuid4()).status_code == 404  # counted too: no free probing
        refused = page.delete(second.id)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1
        assert Conversation.objects.filter(id=second.id).exists()

        other = Page()
        theirs = conversation_of(other)
        assert other.delete(theirs.id).status_code == 204


def _server_log_since(server: LiveServer, start: int) -> str:
    return server.log()[start:]


@pytest.mark.parametrize("serving_path", ["direct", "django"])
def test_deleting_a_conversation_while_its_answer_streams(
    chat_client: ChatClient, daphne: LiveServer, serving_path: str
) -> None:
    """Deleted mid-answer: 204 at once; the answer streams on to its end; when it ends its
    record is stored (telemetry) but not its text, the conversation does not come back, and
    the server logs one info line about it and no warning or error."""
    log_start = len(daphne.log())
    question = "[scripted tokens=200 itl_ms=20] Tell me a long story."
    stream = chat_client.stream(question, url=f"/api/chat/stream/{serving_path}")
    events = [next(stream)]
    meta = events[0].json()
    conversation = meta["conversation"]
    while sum(e.event == "token" for e in events) < 5:
        events.append(next(stream))
    # The question (and the new conversation) are stored after the first token.
    wait_for(lambda: Message.objects.filter(id=meta["user_message"]).exists())

    response = chat_client.client.delete(
        f"/api/conversations/{conversation}", headers={"X-CSRFToken": chat_client.csrf_token}
    )
    assert response.status_code == 204
    assert not Conversation.objects.filter(id=conversation).exists()
    assert not Message.objects.filter(conversation_id=conversation).exists()

    events += list(stream)
    assert events[-1].event == "done", events[-1]
    assert sum(e.event == "token" for e in events) == 200

    record = wait_for(lambda: StreamRecord.objects.filter(request_id=meta["request_id"]).first())
    assert record.outcome == "ok" and str(record.conversation_id) == conversation
    assert record.tokens == 200
    wait_for(lambda: "was deleted while answer" in _server_log_since(daphne, log_start))
    assert not Conversation.objects.filter(id=conversation).exists()
    assert not Message.objects.filter(conversation_id=conversation).exists()
    assert not Message.objects.filter(id=meta["message"]).exists()
    assert chat_client.client.get("/api/conversations").json() == {"conversations": []}

    log = _server_log_since(daphne, log_start)
    said = [line for line in log.splitlines() if conversation in line and " assistant." in line]
    assert len(said) == 1 and " INFO assistant.services.conversations: " in said[0], log
    for loud in (" WARNING ", " ERROR ", " CRITICAL ", "Traceback"):
        assert loud not in log, log
