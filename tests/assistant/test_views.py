"""The chat page and the history API (Django's test client: these are plain Django views)."""

import json
import re
import uuid

import pytest
from django.test import Client

from assistant.models import Conversation, Message
from assistant.services.identity import session_pseudonym

pytestmark = pytest.mark.django_db


def owner_of(client: Client) -> str:
    return f"session:{session_pseudonym(client.session.session_key)}"


def test_page_sets_csrf_cookie_and_session_and_forbids_inline_script() -> None:
    client = Client()
    response = client.get("/")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies
    assert client.session.session_key
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    html = response.content.decode()
    assert 'type="module"' in html
    assert "<script>" not in html


def test_static_page_modules_and_vendored_libraries_are_served() -> None:
    client = Client()
    for path in (
        "/static/chatsite/chat.js",
        "/static/chatsite/stream.js",
        "/static/vendor/marked/marked.esm.js",
        "/static/vendor/dompurify/purify.es.mjs",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
        assert "javascript" in response.headers["Content-Type"], path


def test_page_can_be_pinned_on_a_phone() -> None:
    """Every page names its icon and web app manifest (no favicon 404), and both are served
    with their types; the manifest's icons exist."""
    client = Client()
    html = client.get("/").content.decode()
    links = dict(re.findall(r'<link rel="([\w-]+)" href="([^"]+)"', html))
    assert {"icon", "apple-touch-icon", "manifest"} <= links.keys()
    assert client.get(links["icon"])["Content-Type"] == "image/svg+xml"
    assert client.get(links["apple-touch-icon"])["Content-Type"] == "image/png"
    manifest = client.get(links["manifest"])
    assert manifest["Content-Type"] == "application/manifest+json"
    base = links["manifest"].rsplit("/", 1)[0]
    for icon in json.loads(b"".join(manifest.streaming_content))["icons"]:
        response = client.get(f"{base}/{icon['src']}")
        assert response.status_code == 200 and response["Content-Type"] == icon["type"], icon


def test_history_lists_only_the_owners_conversations() -> None:
    mine, theirs = Client(), Client()
    mine.get("/")
    theirs.get("/")
    conversation = Conversation.objects.create(owner_key=owner_of(mine), title="Cells")
    Message.objects.create(conversation=conversation, role="user", content="What is a cell?")
    Message.objects.create(
        conversation=conversation, role="assistant", content="A unit", status="partial"
    )
    listed = mine.get("/api/conversations").json()["conversations"]
    assert [c["title"] for c in listed] == ["Cells"]
    assert theirs.get("/api/conversations").json() == {"conversations": []}

    detail = mine.get(f"/api/conversations/{conversation.id}").json()
    assert [(m["role"], m["status"]) for m in detail["messages"]] == [
        ("user", "complete"),
        ("assistant", "partial"),
    ]
    response = theirs.get(f"/api/conversations/{conversation.id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "conversation_not_found"


def test_unknown_conversation_is_404() -> None:
    client = Client()
    assert client.get(f"/api/conversations/{uuid.uuid4()}").status_code == 404


def test_history_api_is_read_only() -> None:
    assert Client().post("/api/conversations").status_code in (403, 405)
