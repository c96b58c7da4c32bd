"""The capacity benchmark's parts (assistant/benchmarking/capacity.py): its frame counting, its
figures and its search, and its client against a real Daphne worker. The capacity itself is
measured by benchmarks/capacity.py, not here."""

import asyncio
import itertools
from collections.abc import Callable

import pytest

from assistant.benchmarking.capacity import (
    Answer,
    Level,
    Markers,
    answer,
    crowd,
    follow_up,
    level_figures,
    next_level,
    standing_rows,
)
from assistant.models import Message
from assistant.sse import encode_comment, encode_json_event
from benchmarks.added_latency import build_request
from tests.support import ChatClient, LiveServer, wait_for

STREAM = (
    encode_comment("open")
    + b"".join(encode_json_event({"text": f" t{i}"}, event="token", id=str(i)) for i in range(7))
    + encode_json_event({"finish_reason": "stop"}, event="done")
)


@pytest.mark.parametrize("size", [1, 2, 5, 11, 64])
def test_markers_split_between_reads_are_counted_once(size: int) -> None:
    markers, tokens, done, failed = Markers(), 0, 0, 0
    for start in range(0, len(STREAM), size):
        more, ended, error = markers.feed(STREAM[start : start + size])
        tokens, done, failed = tokens + more, done + ended, failed + error
    assert (tokens, done, failed) == (7, 1, 0)
    assert Markers().feed(encode_json_event({"code": "engine_failed"}, event="error")) == (
        0, False, True,
    )  # fmt: skip


def test_figures_take_the_engines_own_delays_off() -> None:
    ok = [Answer(sent=0.0, ttft_s=0.105, gaps_s=[0.052, 0.050, 0.0], tokens=4) for _ in range(9)]
    slow = Answer(sent=0.0, ttft_s=0.300, gaps_s=[0.250], tokens=2)
    failed = Answer(sent=0.0, error="HTTP/1.1 503 Service Unavailable")
    level = level_figures(
        10,
        [*ok, slow],
        ttft_ms=100,
        itl_ms=50,
        measure_s=2,
        server_cpu_s=0.5,
        client_cpu_s=0.25,
        wall_s=1,
    )
    assert (level.answers, level.errors, level.tokens_per_s) == (10, 0, 19.0)
    assert level.added_ttft_p50 == 5.0
    assert level.added_itl_p50 == 0.0
    assert level.added_itl_max == 200.0
    assert (level.server_cpu, level.client_cpu) == (0.5, 0.25)
    assert not level.passes(50)  # one gap in 28 at +200 ms puts the P99 above 50 ms
    assert level.passes(200)
    with_failure = level_figures(
        10, [*ok, failed], ttft_ms=100, itl_ms=50, measure_s=2,
        server_cpu_s=0, client_cpu_s=0, wall_s=1,
    )  # fmt: skip
    assert (with_failure.errors, with_failure.first_error) == (1, failed.error)
    assert with_failure.added_itl_p99 is not None and with_failure.added_itl_p99 <= 2.0
    assert not with_failure.passes(50)
    waiting = level_figures(
        10, [*ok, Answer(sent=0.0, ttft_s=0.9, gaps_s=[0.05], tokens=2)], ttft_ms=100, itl_ms=50,
        measure_s=2, server_cpu_s=0, client_cpu_s=0, wall_s=1,
    )  # fmt: skip
    assert waiting.added_itl_p99 is not None and waiting.added_itl_p99 <= 2.0
    assert waiting.added_ttft_p99 is not None and waiting.added_ttft_p99 > 500
    assert not waiting.passes(50)  # streams on time once started, but waited 800 ms to start
    assert waiting.passes(50, ttft_limit_ms=1000)
    late = Answer(sent=0.0, ttft_s=0.1, gaps_s=[0.05], tokens=2, end_s=0.4)
    ending = level_figures(
        10, [*ok, *[late] * 2], ttft_ms=100, itl_ms=50,
        measure_s=2, server_cpu_s=0, client_cpu_s=0, wall_s=1,
    )  # fmt: skip
    assert ending.added_itl_p99 is not None and ending.added_itl_p99 <= 2.0
    assert ending.added_end_p99 is not None and ending.added_end_p99 > 50
    assert not ending.passes(50)  # every token on time, but done came 400 ms after the last
    assert ending.passes(500)
    assert level.follow_up_ttft_p50 is None  # none asked
    followed = Answer(sent=0.0, ttft_s=0.170, gaps_s=[0.05], tokens=2, follow_up=True)
    continued = level_figures(
        10, [*ok, followed], ttft_ms=100, itl_ms=50,
        measure_s=2, server_cpu_s=0, client_cpu_s=0, wall_s=1,
    )  # fmt: skip
    assert (continued.added_ttft_p50, continued.follow_up_ttft_p50) == (5.0, 70.0)


def spent(students: int, answers: int, **seconds: float) -> Level:
    """A level of ``answers`` answers whose run took ``seconds`` of CPU by role."""
    made = [Answer(sent=0.0, ttft_s=0.1, gaps_s=[0.05], tokens=2)] * answers
    return level_figures(
        students, made, ttft_ms=100, itl_ms=50, measure_s=2,
        server_cpu_s=sum(seconds.values()), client_cpu_s=0, wall_s=1, cpu_by_role=seconds,
    )  # fmt: skip


def test_cpu_per_answer_is_kept_by_role() -> None:
    level = spent(150, 200, server=1.0, nginx=0.5, Redis=0.1)
    assert level.cpu_ms_per_answer == {"server": 5.0, "nginx": 2.5, "Redis": 0.5}
    alone = level_figures(
        150, [Answer(sent=0.0, ttft_s=0.1, gaps_s=[0.05], tokens=2)] * 4, ttft_ms=100,
        itl_ms=50, measure_s=2, server_cpu_s=0.01, client_cpu_s=0, wall_s=1,
    )  # fmt: skip
    assert alone.cpu_ms_per_answer == {"server": 2.5}
    assert spent(150, 0, server=1.0).cpu_ms_per_answer == {}


def test_the_standing_takes_each_servers_median_over_its_turns() -> None:
    turns = [
        ("chatsite-uvicorn", spent(150, 1000, server=5.0, nginx=3.0)),
        ("uvicorn", spent(150, 1000, server=4.0, nginx=4.0)),
        ("chatsite-uvicorn", spent(150, 1000, server=6.4, nginx=3.0)),
        ("uvicorn", spent(150, 1000, server=5.0, nginx=4.0)),
        ("chatsite-uvicorn", spent(150, 1000, server=4.6, nginx=3.0)),
        ("bare", spent(150, 1000, server=2.0, nginx=3.0)),
        ("uvicorn", spent(300, 1000, server=9.0)),  # no other server at 300
    ]
    rows = standing_rows(turns)
    assert rows[2] == "| bare | 150 | 1 | 2.00 (2.00-2.00) | 5.00 | 0.44 | 1.00 |"
    assert rows[3] == "| chatsite-uvicorn | 150 | 3 | 5.00 (4.60-6.40) | 8.00 | 1.11 | 2.50 |"
    assert rows[4] == "| uvicorn | 150 | 2 | 4.50 (4.00-5.00) | 8.50 | 1.00 | 2.25 |"
    assert rows[5] == "| uvicorn | 300 | 1 | 9.00 (9.00-9.00) | 9.00 | 1.00 | - |"
    assert len(rows) == 6


def search(
    capacity: int, *, start: int = 50, most: int = 3200, resolution: float = 0.1
) -> list[int]:
    """The levels tried against a server that keeps up with ``capacity`` students."""
    passed: list[int] = []
    failed: list[int] = []
    tried: list[int] = []
    while (
        n := next_level(passed, failed, start=start, most=most, resolution=resolution)
    ) is not None:
        assert n not in tried and len(tried) < 30
        tried.append(n)
        (passed if n <= capacity else failed).append(n)
    return tried


@pytest.mark.parametrize("capacity", [0, 1, 7, 49, 50, 99, 300, 777, 1000, 3199, 5000])
def test_the_search_ends_within_its_resolution_of_the_capacity(capacity: int) -> None:
    tried = search(capacity)
    found = max((n for n in tried if n <= capacity), default=0)
    assert found <= capacity
    if capacity >= 3200:
        assert found == 3200
    elif found:
        assert capacity - found <= max(1, found * 0.1), tried
    else:
        assert capacity < min(tried), tried
    assert tried[0] == 50


@pytest.fixture(scope="module")
def worker(daphne_factory: Callable[..., LiveServer]) -> LiveServer:
    return daphne_factory(
        CHATSITE_STREAMS_PER_SESSION="0",
        CHATSITE_SCRIPTED_TTFT_MS="30",
        CHATSITE_SCRIPTED_TOKENS="6",
        CHATSITE_SCRIPTED_ITL_MS="20",
    )


@pytest.mark.django_db(transaction=True)
def test_students_in_a_closed_loop_read_whole_answers_from_daphne(worker: LiveServer) -> None:
    client = ChatClient(worker)
    cookies = "; ".join(f"{c.name}={c.value}" for c in client.client.cookies.jar)
    body = b'{"message": "What is photosynthesis?"}'
    request = build_request(worker.port, body, cookies, client.csrf_token)
    answers, client_cpu_s = asyncio.run(crowd(worker.port, request, 3, warmup_s=0.2, measure_s=1.5))
    client.close()
    assert answers, "no answer started within the measured time"
    assert [a.error for a in answers if a.error] == []
    assert {a.tokens for a in answers} == {6}
    assert {len(a.gaps_s) for a in answers} == {5}
    assert all(a.ttft_s is not None and a.ttft_s >= 0.03 for a in answers)
    assert all(gap >= 0 for a in answers for gap in a.gaps_s)
    assert all(a.end_s is not None and a.end_s >= 0 for a in answers)
    assert 0 < client_cpu_s < 60

    forged = build_request(worker.port, body, cookies, "not-the-token")
    refused, _ = asyncio.run(crowd(worker.port, forged, 1, warmup_s=0, measure_s=0.3))
    assert refused and all(a.error and a.error.startswith("HTTP/1.1 403") for a in refused)
    assert list(itertools.chain.from_iterable(a.gaps_s for a in refused)) == []


@pytest.mark.django_db(transaction=True)
def test_students_go_on_with_the_conversations_they_began(worker: LiveServer) -> None:
    """With ``follow_ups`` a student asks that many more questions in the conversation their
    first began (the id its first frame names), then begins another."""
    client = ChatClient(worker)
    cookies = "; ".join(f"{c.name}={c.value}" for c in client.client.cookies.jar)
    body = b'{"message": "[scripted tokens=2 ttft_ms=1 itl_ms=1] Why?"}'
    request = build_request(worker.port, body, cookies, client.csrf_token)
    assert follow_up(request, "c0ffee00-0000-7000-8000-000000000000").endswith(
        b'{"message": "[scripted tokens=2 ttft_ms=1 itl_ms=1] Why?", '
        b'"conversation": "c0ffee00-0000-7000-8000-000000000000"}'
    )
    answers, _ = asyncio.run(
        crowd(worker.port, request, 1, warmup_s=0, measure_s=1.5, follow_ups=2)
    )
    client.close()
    assert len(answers) >= 6 and [a.error for a in answers if a.error] == []
    began = [a.conversation for a in answers]
    assert None not in began
    # In the order asked: each conversation three questions in a row (the last maybe fewer).
    runs = [len(list(group)) for _, group in itertools.groupby(began)]
    assert runs[:-1] == [3] * (len(runs) - 1) and 1 <= runs[-1] <= 3, runs
    # The first of each run began it; the others followed up.
    assert [a.follow_up for a in answers[:6]] == [False, True, True] * 2
    asked = Message.objects.filter(conversation_id=began[0], role="user")
    assert wait_for(lambda: asked.count() == 3, timeout=10), asked.count()


def test_each_student_sends_their_own_request_from_their_own_address() -> None:
    seen: set[tuple[str, str]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode()
        seen.add((writer.get_extra_info("peername")[0], path))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + STREAM)
        await writer.drain()
        writer.close()

    async def run() -> list[Answer]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        requests = [f"GET /s{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(3)]
        async with server:
            answers, _ = await crowd(
                port, requests, 3, warmup_s=0, measure_s=1.0, source=lambda i: f"127.0.2.{i + 1}"
            )
        return answers

    answers = asyncio.run(run())
    assert answers and all(a.error is None and a.tokens == 7 for a in answers)
    assert seen == {("127.0.2.1", "/s0"), ("127.0.2.2", "/s1"), ("127.0.2.3", "/s2")}


def test_the_wait_for_a_connection_counts_in_the_time_to_the_first_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server slow to take a connection (its listen queue full) keeps the student waiting at
    the door: the time to the first token counts from the question, not from the connection."""
    opened = asyncio.open_connection

    async def slow_to_open(*args: object, **kwargs: object) -> object:
        await asyncio.sleep(0.3)
        return await opened(*args, **kwargs)  # type: ignore[arg-type]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + STREAM)
        await writer.drain()
        writer.close()

    async def run() -> Answer:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await answer(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    monkeypatch.setattr(asyncio, "open_connection", slow_to_open)
    found = asyncio.run(run())
    assert found.error is None and found.tokens == 7
    assert found.ttft_s is not None and found.ttft_s >= 0.3


def test_a_setting_for_chatsites_workers_is_name_equals_value() -> None:
    import argparse

    from benchmarks.capacity import env_setting

    assert env_setting("CHATSITE_LOG_LEVEL=WARNING") == ("CHATSITE_LOG_LEVEL", "WARNING")
    assert env_setting("CHATSITE_X=a=b") == ("CHATSITE_X", "a=b")
    assert env_setting("CHATSITE_X=") == ("CHATSITE_X", "")
    for wrong in ("CHATSITE_X", "=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            env_setting(wrong)
