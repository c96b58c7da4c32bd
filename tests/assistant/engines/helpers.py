"""What the engine tests share: a short prompt, greedy decoding, and two ways to read a stream."""

import time
from contextlib import aclosing

from assistant.engines import BaseEngine, ChatMessage, Delta, GenerationParams

SHORT = [ChatMessage("user", "Name three colours of the rainbow.")]
GREEDY = GenerationParams(max_tokens=24, temperature=0.0)
LONG = [ChatMessage("user", "Write a long, detailed story about a dragon who learns to read.")]
ENDLESS = GenerationParams(max_tokens=400, temperature=0.0)


async def collect(
    engine: BaseEngine, messages: list[ChatMessage], params: GenerationParams
) -> list[Delta]:
    async with aclosing(engine.stream(messages, params)) as deltas:  # type: ignore[type-var]
        return [delta async for delta in deltas]


async def first_delta_after(engine: BaseEngine, since: float) -> float:
    """Seconds from ``since`` until a new short request gets its first delta."""
    async with aclosing(engine.stream(SHORT, GREEDY)) as deltas:  # type: ignore[type-var]
        delta = await anext(deltas)
    assert delta.text
    return time.monotonic() - since


def assert_streamed_answer(deltas: list[Delta], max_tokens: int) -> None:
    """Several non-empty pieces, a finish reason on the last delta only, max_tokens honoured."""
    pieces = [d.text for d in deltas if d.text]
    assert len(pieces) >= 3, deltas
    assert all(d.finish_reason is None for d in deltas[:-1]), deltas
    assert deltas[-1].finish_reason in {"stop", "length"}, deltas
    assert "".join(pieces).strip()
    assert len(pieces) <= max_tokens


async def close_early_then_ask(engine: BaseEngine) -> tuple[list[Delta], float]:
    """Close a 400-token answer after 3 pieces; return them and the seconds a new short request
    then waits for its first delta (long if the abandoned answer kept the engine busy)."""
    async with aclosing(engine.stream(LONG, ENDLESS)) as deltas:  # type: ignore[type-var]
        received = [await anext(deltas) for _ in range(3)]
    return received, await first_delta_after(engine, time.monotonic())
