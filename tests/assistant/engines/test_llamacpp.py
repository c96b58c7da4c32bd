"""The embedded llama.cpp engine, with the real SmolLM2-135M model on the CPU.

Greedy decoding (temperature 0) keeps the answers the same from run to run. Bounds on time are
generous sanity checks: on a busy two-core machine the model decodes 15 to 70 tokens a second, so
finishing an abandoned 400-token answer would take 6 to 30 s, far above any bound used here.
"""

import asyncio
import time
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path

import pytest

from assistant.benchmarking.repetition import most_repeated
from assistant.engines import ChatMessage, Delta, EngineUnavailable, GenerationParams
from assistant.engines.llamacpp import LlamaCppEngine
from tests.assistant.engines.helpers import (
    ENDLESS,
    GREEDY,
    LONG,
    SHORT,
    assert_streamed_answer,
    close_early_then_ask,
    collect,
    first_delta_after,
)

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    """One engine for the module, loaded and warmed up once.

    One decoding thread leaves the second core to the event loop that takes the tokens.
    """
    engine = LlamaCppEngine("test", {"N_CTX": 2048, "N_THREADS": 1})
    engine.load()
    asyncio.run(collect(engine, SHORT, GenerationParams(max_tokens=2, temperature=0.0)))
    yield engine


async def test_streams_answer_in_pieces_and_ends_with_finish_reason(
    engine: LlamaCppEngine,
) -> None:
    """The answer comes as several non-empty pieces; the stream ends with a finish reason."""
    assert_streamed_answer(await collect(engine, SHORT, GREEDY), GREEDY.max_tokens)


async def test_max_tokens_cuts_the_answer_with_length(engine: LlamaCppEngine) -> None:
    """A long answer stops at max_tokens with finish reason "length"."""
    deltas = await collect(engine, LONG, GenerationParams(max_tokens=8, temperature=0.0))

    pieces = [d.text for d in deltas if d.text]
    assert 1 <= len(pieces) <= 8, deltas
    assert deltas[-1].finish_reason == "length", deltas


async def test_aclose_frees_the_engine_for_the_next_request(engine: LlamaCppEngine) -> None:
    """Closing a 400-token answer after 3 pieces lets the next request start within 2.5 s."""
    received, waited = await close_early_then_ask(engine)

    assert all(d.text for d in received), received
    assert waited < 2.5, f"the next request waited {waited:.2f} s for the engine"
    assert engine.queue_depth() == 0


async def test_cancelling_the_consumer_stops_decoding(engine: LlamaCppEngine) -> None:
    """Cancelling the task that reads a 400-token answer stops decoding: the process goes idle."""
    three = asyncio.Event()
    received: list[Delta] = []

    async def consume() -> None:
        async with aclosing(engine.stream(LONG, ENDLESS)) as deltas:
            async for delta in deltas:
                received.append(delta)
                if len(received) == 3:
                    three.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(three.wait(), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cancelled = time.monotonic()
    # The token being decoded when the task was cancelled still finishes (a few ms).
    await asyncio.sleep(0.2)
    cpu_before, wall_before = time.process_time(), time.monotonic()
    await asyncio.sleep(0.5)
    cpu = time.process_time() - cpu_before
    wall = time.monotonic() - wall_before

    # Decoding keeps one core busy (about 0.5 s of CPU in this window); idle is near zero.
    assert cpu < 0.2 * wall, f"the process used {cpu:.2f} s of CPU in {wall:.2f} s after cancel"
    assert len(received) < 10, len(received)
    assert await first_delta_after(engine, cancelled) < 2.5


async def test_concurrent_requests_are_served_one_at_a_time_in_arrival_order(
    engine: LlamaCppEngine,
) -> None:
    """Three requests started together are answered whole, one after another, in order; while
    they wait, they are told their place in line (1 is next)."""
    events: list[tuple[str, int]] = []
    places: dict[int, list[int]] = {0: [], 1: [], 2: []}
    params = GenerationParams(max_tokens=12, temperature=0.0)

    async def consume(index: int) -> str:
        pieces: list[str] = []
        async with aclosing(engine.stream(SHORT, params)) as deltas:
            async for delta in deltas:
                if delta.queue_position is not None:
                    assert not pieces and not delta.text
                    places[index].append(delta.queue_position)
                    continue
                if not pieces:
                    events.append(("first", index))
                pieces.append(delta.text)
                if delta.finish_reason:
                    events.append(("finish", index))
        return "".join(pieces)

    tasks = [asyncio.create_task(consume(i)) for i in range(3)]
    answers = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

    assert events == [
        ("first", 0),
        ("finish", 0),
        ("first", 1),
        ("finish", 1),
        ("first", 2),
        ("finish", 2),
    ]
    assert all(answer.strip() for answer in answers), answers
    # The last one waited through two answers, so it heard where it stood; places only count
    # down, never past the requests really ahead.
    assert places[2], places
    assert all(
        p == sorted(p, reverse=True) and all(1 <= x <= i for x in p) for i, p in places.items()
    ), places


async def test_queue_depth_counts_requests_waiting_behind_the_running_one(
    engine: LlamaCppEngine,
) -> None:
    """queue_depth() is 2, 1, 0 as each of three requests starts, and 0 when all are done."""
    depth_at_first: dict[int, int] = {}
    params = GenerationParams(max_tokens=6, temperature=0.0)

    async def consume(index: int) -> None:
        async with aclosing(engine.stream(SHORT, params)) as deltas:
            async for delta in deltas:
                if delta.queue_position is None:  # its first word, not its place in line
                    depth_at_first.setdefault(index, engine.queue_depth())

    assert engine.queue_depth() == 0
    tasks = [asyncio.create_task(consume(i)) for i in range(3)]
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

    assert depth_at_first == {0: 2, 1: 1, 2: 0}
    assert engine.queue_depth() == 0


async def test_a_waiting_request_that_is_cancelled_leaves_the_queue_at_once(
    engine: LlamaCppEngine,
) -> None:
    """Cancelling a request that waits takes it out of queue_depth() before its turn comes;
    all it heard was its place in line, at once."""
    waiter_got: list[Delta] = []

    async def wait_in_line() -> None:
        async with aclosing(engine.stream(SHORT, GREEDY)) as deltas:
            async for delta in deltas:
                waiter_got.append(delta)

    async with aclosing(engine.stream(LONG, ENDLESS)) as deltas:
        await anext(deltas)
        waiter = asyncio.create_task(wait_in_line())
        await asyncio.sleep(0)  # the waiter's first step submits its request
        assert engine.queue_depth() == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert engine.queue_depth() == 0
        await anext(deltas)  # the running answer goes on

    assert waiter_got == [Delta("", queue_position=1)]
    assert await first_delta_after(engine, time.monotonic()) < 2.5
    assert engine.queue_depth() == 0


async def test_missing_model_file_is_engine_unavailable(tmp_path: Path) -> None:
    """A model path that does not exist gives EngineUnavailable, from load() and from stream()."""
    engine = LlamaCppEngine("missing", {"MODEL_PATH": str(tmp_path / "missing.gguf")})

    with pytest.raises(EngineUnavailable) as loading:
        engine.load()
    with pytest.raises(EngineUnavailable) as streaming:
        await collect(engine, SHORT, GREEDY)

    assert loading.value.code == "no_model"
    assert streaming.value.code == "no_model"
    assert "missing.gguf" in str(loading.value)


async def test_default_sampling_does_not_loop_on_a_chinese_question(
    engine: LlamaCppEngine,
) -> None:
    """Asked why the sky is blue in Chinese (greedy, so the same every run), the default repeat
    penalty ends the answer on its own with no sentence said three times; without the penalty
    the model repeats itself until the cap."""
    system = "You are a patient, friendly teaching assistant. Answer clearly and briefly."
    question = [ChatMessage("system", system), ChatMessage("user", "天空为什么是蓝色的？")]
    defaults = replace(LlamaCppEngine.default_generation, temperature=0.0)
    neutral = replace(defaults, repeat_penalty=1.0, top_p=1.0)

    penalised = await collect(engine, question, defaults)
    looping = await collect(engine, question, neutral)

    def text(deltas: list[Delta]) -> str:
        return "".join(d.text for d in deltas)

    assert penalised[-1].finish_reason == "stop", text(penalised)
    assert most_repeated(text(penalised)) < 3, text(penalised)
    assert looping[-1].finish_reason == "length", text(looping)
    assert most_repeated(text(looping)) >= 3, text(looping)
