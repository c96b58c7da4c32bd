"""/healthz and /readyz on a real Daphne: cheap, sessionless, and honest about what is down."""

import httpx
import pytest
from django.contrib.sessions.models import Session

from assistant.benchmarking.ports import free_port
from tests.support import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)


def test_healthz_answers_ok_and_stores_no_session(daphne: LiveServer) -> None:
    """A hundred probes: 200 {"status": "ok"} each, no cookie set, no session row written."""
    before = Session.objects.count()
    with httpx.Client(base_url=daphne.url) as client:
        answers = [client.get("/healthz") for _ in range(100)]

    assert {a.status_code for a in answers} == {200}
    assert answers[0].json() == {"status": "ok"}
    assert not any("set-cookie" in a.headers for a in answers)
    assert Session.objects.count() == before


def test_readyz_names_each_component_ok(daphne: LiveServer) -> None:
    """With the database, the cache and the scripted engine up: 200, each check "ok"."""
    response = httpx.get(f"{daphne.url}/readyz", timeout=5)

    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": "ready",
        "checks": {"database": "ok", "cache": "ok", "engine:default": "ok"},
    }
    assert "set-cookie" not in response.headers
    assert response.headers["cache-control"] == "no-store"


def test_probes_answer_head_and_refuse_other_methods(daphne: LiveServer) -> None:
    """HEAD gets the status without a body; POST gets 405 with Allow: GET, HEAD."""
    with httpx.Client(base_url=daphne.url) as client:
        head = client.head("/healthz")
        post = client.post("/readyz", json={})

    assert head.status_code == 200 and head.content == b""
    assert post.status_code == 405
    assert post.headers["allow"] == "GET, HEAD"
    assert post.json()["error"]["code"] == "method_not_allowed"


def test_readyz_is_503_naming_an_unreachable_model_server(daphne_factory) -> None:
    """The OpenAI-compatible engine pointed at a port nobody listens on: 503, the engine named,
    the database and the cache still "ok"; /healthz stays 200."""
    server = daphne_factory(
        CHATSITE_ENGINE="openai-http", CHATSITE_VLLM_URL=f"http://127.0.0.1:{free_port()}/v1"
    )

    ready = httpx.get(f"{server.url}/readyz", timeout=5)
    health = httpx.get(f"{server.url}/healthz", timeout=5)

    assert ready.status_code == 503, ready.text
    assert ready.json() == {
        "status": "not_ready",
        "checks": {"database": "ok", "cache": "ok", "engine:default": "engine_unavailable"},
    }
    assert health.status_code == 200


def test_readyz_is_503_when_the_embedded_model_cannot_load(daphne_factory, tmp_path) -> None:
    """A model file that does not exist: the worker still serves, /readyz says "no_model"."""
    server = daphne_factory(
        CHATSITE_ENGINE="llamacpp", CHATSITE_LLAMACPP_MODEL_PATH=str(tmp_path / "none.gguf")
    )

    ready = httpx.get(f"{server.url}/readyz", timeout=5)

    assert ready.status_code == 503, ready.text
    assert ready.json()["checks"]["engine:default"] == "no_model"
