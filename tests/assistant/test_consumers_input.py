"""Every bad request gets a clear JSON error with a 4xx, and the server keeps serving: the same
error, byte for byte, on both serving paths."""

import json
import uuid

import pytest

from tests.support import ChatClient, LiveServer, raw_post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["direct", "django"])
def url(request: pytest.FixtureRequest) -> str:
    return f"/api/chat/stream/{request.param}"


def error_of(response) -> tuple[int, str, str]:
    assert response.header("content-type") == "application/json"
    payload = json.loads(response.body())
    return response.status, payload["error"]["code"], payload["error"]["message"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b"[]", "invalid_body"),
        (b'"hello"', "invalid_body"),
        (b"{}", "message_missing"),
        (b'{"message": ""}', "message_missing"),
        (b'{"message": "   \\n "}', "message_missing"),
        (b'{"message": 42}', "invalid_body"),
        (b'{"message": "hi", "conversation": "not-a-uuid"}', "invalid_conversation"),
        (b'{"message": "hi", "conversation": 7}', "invalid_conversation"),
    ],
)
def test_malformed_bodies_get_400(
    chat_client: ChatClient, body: bytes, code: str, url: str
) -> None:
    status, got_code, message = error_of(chat_client.raw(body, path=url))
    assert (status, got_code) == (400, code)
    assert message and "Traceback" not in message


def test_over_long_message_gets_400_naming_the_limit(chat_client: ChatClient, url: str) -> None:
    status, code, message = error_of(chat_client.raw({"message": "x" * 4001}, path=url))
    assert (status, code) == (400, "message_too_long")
    assert "4000" in message


def test_body_over_the_size_limit_gets_413(chat_client: ChatClient, url: str) -> None:
    status, code, _ = error_of(chat_client.raw({"message": "x" * 40_000}, path=url))
    assert (status, code) == (413, "body_too_large")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_other_methods_get_405_with_allow(daphne: LiveServer, method: str, url: str) -> None:
    response = raw_post(daphne.port, b"", method=method, path=url)
    status, code, _ = error_of(response)
    assert (status, code) == (405, "method_not_allowed")
    assert response.header("allow") == "POST"


def test_non_json_content_type_gets_415(chat_client: ChatClient, url: str) -> None:
    response = chat_client.raw(b"message=hi", headers={"Content-Type": "text/plain"}, path=url)
    assert error_of(response)[:2] == (415, "unsupported_media_type")


def test_a_multipart_body_is_the_applications_to_refuse(chat_client: ChatClient, url: str) -> None:
    """Daphne's HTTP layer (Twisted) does not parse a POST's body as a form: a multipart body
    it could not parse would get a bare 400 of its own before chatsite saw the request."""
    response = chat_client.raw(
        b"message=hi", headers={"Content-Type": "multipart/form-data; boundary=x"}, path=url
    )
    assert error_of(response)[:2] == (415, "unsupported_media_type")


def test_missing_csrf_token_gets_403(chat_client: ChatClient, url: str) -> None:
    response = raw_post(
        chat_client.server.port,
        b'{"message": "hi"}',
        cookies=chat_client.cookies(),
        headers={"Content-Type": "application/json"},
        path=url,
    )
    status, code, message = error_of(response)
    assert (status, code) == (403, "csrf_failed")
    assert "CSRF token missing" in message


def test_wrong_csrf_token_gets_403(chat_client: ChatClient, url: str) -> None:
    response = chat_client.raw({"message": "hi"}, headers={"X-CSRFToken": "x" * 32}, path=url)
    assert error_of(response)[:2] == (403, "csrf_failed")


def test_cross_origin_post_gets_403_even_with_a_token(chat_client: ChatClient, url: str) -> None:
    """Django's Origin check applies: a page on another site cannot start streams."""
    response = chat_client.raw(
        {"message": "hi"}, headers={"Origin": "https://evil.example"}, path=url
    )
    status, code, message = error_of(response)
    assert (status, code) == (403, "csrf_failed")
    assert "Origin" in message


def test_unknown_host_gets_400(chat_client: ChatClient, url: str) -> None:
    response = chat_client.raw({"message": "hi"}, headers={"Host": "evil.example"}, path=url)
    assert error_of(response)[:2] == (400, "bad_host")


def test_a_body_django_cannot_read_is_the_json_error(chat_client: ChatClient) -> None:
    """A request Django itself refuses before a view answers (``handler400``; here a report,
    as sendBeacon sends it with its token in the body, whose multipart body the CSRF check
    cannot parse): the JSON error to a script, Django's page to a browser's navigation."""
    report = {"request_id": "0" * 32, "outcome": "ok", "csrf_token": chat_client.csrf_token}
    body = json.dumps(report).encode()
    headers = {"Content-Type": "multipart/form-data", "X-CSRFToken": ""}
    response = chat_client.raw(body, headers=headers, path="/api/chat/beacon")
    assert error_of(response)[:2] == (400, "bad_request")
    page = chat_client.raw(
        body, headers={**headers, "Accept": "text/html"}, path="/api/chat/beacon"
    )
    assert page.status == 400
    assert (page.header("content-type") or "").startswith("text/html")


def test_unknown_conversation_gets_404(chat_client: ChatClient, url: str) -> None:
    response = chat_client.raw({"message": "hi", "conversation": str(uuid.uuid4())}, path=url)
    assert error_of(response)[:2] == (404, "conversation_not_found")


def test_the_server_keeps_serving_after_bad_input(chat_client: ChatClient, url: str) -> None:
    for body in (b"{", b"[]", b'{"message": ""}'):
        assert chat_client.raw(body, path=url).status == 400
    events = chat_client.ask("[scripted tokens=2]", url=url)
    assert events[-1].event == "done"


def test_engine_that_cannot_load_gets_503_before_streaming(
    daphne_factory, tmp_path, url: str
) -> None:
    """A broken model file does not stop the site; chat requests get a clear 503."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"this is not a gguf file")
    server = daphne_factory(CHATSITE_ENGINE="llamacpp", CHATSITE_LLAMACPP_MODEL_PATH=str(broken))
    client = ChatClient(server)
    try:
        status, code, message = error_of(client.raw({"message": "hello"}, path=url))
        assert (status, code) == (503, "engine_unavailable")
        assert "try again" in message
        assert "Engine 'default' is unavailable" in server.log()
    finally:
        client.close()
