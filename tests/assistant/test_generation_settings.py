"""Sampling settings: from the environment, per engine alias, to what the engine is given."""

import pytest

from assistant.engines.base import GenerationParams, generation_from_options
from assistant.engines.llamacpp import LlamaCppEngine
from assistant.engines.openai_http import OpenAIHTTPEngine
from tests.support import ChatClient

pytestmark = pytest.mark.django_db(transaction=True)


def test_options_override_only_what_they_set() -> None:
    """Set options replace the backend's defaults, typed; unset (None) ones keep them."""
    defaults = GenerationParams(max_tokens=100, temperature=0.5, repeat_penalty=1.1)

    got = generation_from_options(
        defaults, {"MAX_TOKENS": "42", "TOP_P": "0.9", "TEMPERATURE": None, "MODEL": "x"}
    )

    assert got == GenerationParams(max_tokens=42, temperature=0.5, top_p=0.9, repeat_penalty=1.1)


def test_each_backend_has_its_own_defaults() -> None:
    """The embedded model penalises repeats by default; the OpenAI-compatible one stays neutral
    (the served model's own generation config decides)."""
    embedded = LlamaCppEngine("embedded", {"MODEL_PATH": "/nonexistent.gguf"})
    served = OpenAIHTTPEngine("served", {})

    assert embedded.generation.repeat_penalty > 1.0
    assert embedded.generation.max_tokens <= 512
    assert served.generation.repeat_penalty == 1.0


@pytest.mark.parametrize("path", ["direct", "django"])
def test_settings_from_the_environment_reach_the_engine(daphne_factory, path: str) -> None:
    """CHATSITE_MAX_TOKENS, _TOP_P and _REPEAT_PENALTY reach the engine on both serving paths,
    and the answer stops at the configured length."""
    server = daphne_factory(
        CHATSITE_MAX_TOKENS="7", CHATSITE_TOP_P="0.8", CHATSITE_REPEAT_PENALTY="1.3"
    )
    client = ChatClient(server)

    events = client.ask(f"[scripted tokens=20 tag=gen-{path}] Hi", url=f"/api/chat/stream/{path}")

    start = server.wait_engine_event(f"gen-{path}", "start")
    assert start["params"]["max_tokens"] == 7
    assert start["params"]["top_p"] == 0.8
    assert start["params"]["repeat_penalty"] == 1.3
    assert sum(1 for e in events if e.event == "token") == 7
    assert events[-1].event == "done" and '"length"' in events[-1].data
    client.close()
