"""The deterministic test engine: its directives, failures and cancellation record."""

import json

import pytest

from assistant.engines import ChatMessage, EngineError, EngineUnavailable, GenerationParams
from assistant.engines.scripted import ScriptedEngine, default_tokens, parse_directive


def engine(tmp_path, **options) -> ScriptedEngine:
    return ScriptedEngine(
        "test", {"TTFT_MS": 0, "ITL_MS": 0, "EVENTS_FILE": str(tmp_path / "e"), **options}
    )


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text)]


async def collect(eng: ScriptedEngine, text: str) -> list[str]:
    return [d.text async for d in eng.stream(ask(text), GenerationParams()) if d.text]


def test_directive_values_may_hold_brackets_and_spaces() -> None:
    args = parse_directive("""[scripted text='["<b>x</b>", " y]"]' tokens=3] question""")
    assert args == {"text": '["<b>x</b>", " y]"]', "tokens": "3"}
    assert parse_directive("no directive here") == {}


async def test_tokens_text_and_failures(tmp_path) -> None:
    eng = engine(tmp_path)
    assert await collect(eng, "[scripted tokens=4]") == default_tokens(4)
    assert await collect(eng, """[scripted text='["a\\n", "<i>"]']""") == ["a\n", "<i>"]
    with pytest.raises(EngineUnavailable):
        await collect(eng, "[scripted fail_after=0]")
    with pytest.raises(EngineError) as failed:
        await collect(eng, "[scripted tokens=5 fail_after=2]")
    assert type(failed.value) is EngineError
    with pytest.raises(EngineUnavailable):
        await collect(eng, "[scripted text=not-json]")


async def test_cancellation_is_recorded_with_the_tokens_sent(tmp_path) -> None:
    eng = engine(tmp_path, ITL_MS=10)
    stream = eng.stream(ask("[scripted tokens=50 tag=t1]"), GenerationParams())
    assert (await anext(stream)).text == default_tokens(1)[0]
    await anext(stream)
    await stream.aclose()
    rows = [json.loads(line) for line in (tmp_path / "e").read_text().splitlines()]
    assert [(r["event"], r["tag"]) for r in rows] == [("start", "t1"), ("cancel", "t1")]
    assert rows[1]["tokens"] == 2


async def test_max_tokens_cuts_with_finish_reason_length(tmp_path) -> None:
    eng = engine(tmp_path)
    deltas = [
        d async for d in eng.stream(ask("[scripted tokens=10]"), GenerationParams(max_tokens=3))
    ]
    assert [d.text for d in deltas[:-1]] == default_tokens(3)
    assert deltas[-1].finish_reason == "length"
