"""Capacity: how many students streaming at once one server keeps up with.

Each student asks in a closed loop (a new connection per question, the next question as soon as
the answer ends), so that ``students`` answers are always streaming. The engine writes a token
every ``itl_ms``; what the stack adds to that gap is the *added inter-token latency*:

    added ITL = (time between two token frames as the client reads them) - itl_ms

A level passes when no answer failed, the P99 of the added ITL is within its limit (50 ms by
default) and the P99 of the added time to the first token within its own (500 ms, the HighTTFT
alert's threshold): a server that has more students than it can take makes them wait at the
door, where their answers, once started, may still stream on time. That wait counts from the
moment the student asks, before the connection is open: a server whose listen queue is full
keeps its students in the kernel's retries, and the time to the first token shows it. And the
P99 of the wait from the last token to ``done`` must be within the ITL limit too: the engine's
stream ends with its last token, the page lets the student ask again at ``done``, and a server
slow to end its answers keeps fewer of them streaming (their gaps then look short).

The client is cheap on purpose: one timestamp per read from the socket and a count of
``event: token`` markers in it, no event parsing, so that the load generator's own CPU stays
well below the server's (the benchmark reports both).

With ``follow_ups`` each student goes on with the conversation their question began (the id in
the first frame, when the server sends one) for that many questions, then begins another: a
class's students ask follow-ups far more often than they start over.
"""

import asyncio
import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .stats import percentile

TOKEN = b"event: token"
DONE = b"event: done"
ERROR = b"event: error"
#: The conversation an answer belongs to, in its first frame (``event: meta``).
CONVERSATION = re.compile(rb'"conversation": ?"([0-9a-f-]{36})"')
#: A level's P99 added time to the first token at most (the HighTTFT alert fires above it).
TTFT_LIMIT_MS = 500.0


@dataclass(slots=True)
class Answer:
    """One question's answer as the client read it; times are ``perf_counter`` seconds."""

    sent: float
    ttft_s: float | None = None
    #: Seconds between consecutive token frames (frames read together count as 0 apart).
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None
    #: Seconds from the last token frame to the ``done`` event.
    end_s: float | None = None
    #: The conversation it belongs to, where the server named one.
    conversation: str | None = None
    #: Asked in a conversation an earlier answer began (``crowd``'s ``follow_ups``).
    follow_up: bool = False


class Markers:
    """The token, done and error markers in a stream read piece by piece: a marker split
    between two reads is counted once, when its last byte arrives."""

    __slots__ = ("tail",)

    def __init__(self) -> None:
        self.tail = b""

    def feed(self, data: bytes) -> tuple[int, bool, bool]:
        """Tokens completed by ``data``, and whether the done or the error event began."""
        joined = self.tail + data
        tokens, done, error = (joined.count(m) - self.tail.count(m) for m in (TOKEN, DONE, ERROR))
        self.tail = joined[-len(TOKEN) :]
        return tokens, done > 0, error > 0


async def answer(
    port: int, request: bytes, *, timeout_s: float = 30, source: str | None = None
) -> Answer:
    """Send ``request`` on a new loopback connection (from address ``source``, if given) and
    read the answer to its end."""
    result = Answer(sent=time.perf_counter())
    writer = None
    local = (source, 0) if source else None
    try:
        async with asyncio.timeout(timeout_s):
            # ``sent`` stays the moment the student asked: a connection the server is slow to
            # take (a full listen queue, whose dropped SYN the kernel sends again a second
            # later) is part of the wait for the first token.
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                result.error = head.split(b"\r\n", 1)[0].decode(errors="replace")
                return result
            markers, last, done = Markers(), 0.0, False
            while not done and (data := await reader.read(65536)):
                now = time.perf_counter()
                if result.conversation is None and (named := CONVERSATION.search(data)):
                    result.conversation = named.group(1).decode()
                tokens, done, failed = markers.feed(data)
                if failed:
                    result.error = "event: error"
                    return result
                for _ in range(tokens):
                    if result.ttft_s is None:
                        result.ttft_s = now - result.sent
                    else:
                        result.gaps_s.append(now - last)
                    last = now
                    result.tokens += 1
            if not done:
                result.error = "ended before event: done"
            elif result.ttft_s is not None:
                result.end_s = time.perf_counter() - last
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as error:
        result.error = type(error).__name__
    finally:
        if writer is not None:
            writer.close()
    return result


async def crowd(
    port: int,
    request: bytes | Sequence[bytes],
    students: int,
    *,
    warmup_s: float,
    measure_s: float,
    source: Callable[[int], str] | None = None,
    follow_ups: int = 0,
) -> tuple[list[Answer], float]:
    """``students`` students asking in a closed loop; the answers asked for during the
    ``measure_s`` seconds after ``warmup_s`` (those started earlier or later are left out), and
    the client's own CPU seconds over the run. The students start spread over the first second
    of the warm-up, not all in the same instant. ``request``: one for every student, or one per
    student (student ``i`` sends number ``i`` modulo their count: a session each); ``source``:
    the loopback address student ``i`` connects from (a class's, behind its school's NAT);
    ``follow_ups``: questions each student asks in the conversation they began (the module
    docstring)."""
    asks = [request] if isinstance(request, bytes) else list(request)
    start = time.perf_counter()
    begin, end = start + warmup_s, start + warmup_s + measure_s
    kept: list[Answer] = []
    cpu_before = sum(os.times()[:2])

    async def student(i: int) -> None:
        await asyncio.sleep(i / students)
        mine, address = asks[i % len(asks)], source(i) if source else None
        asking, asked = mine, 0
        while time.perf_counter() < end:
            one = await answer(port, asking, source=address)
            one.follow_up = asked > 0
            if begin <= one.sent < end:
                kept.append(one)
            if one.error:
                await asyncio.sleep(0.1)  # not a hot loop against a refusing server
            if asked < follow_ups and one.conversation and not one.error:
                asking, asked = follow_up(mine, one.conversation), asked + 1
            else:
                asking, asked = mine, 0

    await asyncio.gather(*(student(i) for i in range(students)))
    return kept, sum(os.times()[:2]) - cpu_before


def follow_up(request: bytes, conversation: str) -> bytes:
    """``request`` (an HTTP request whose body is a JSON question) asked in ``conversation``."""
    head, _, body = request.partition(b"\r\n\r\n")
    question = json.loads(body)
    question["conversation"] = conversation
    asked = json.dumps(question).encode()
    head = re.sub(rb"(?im)^content-length: *\d+", b"Content-Length: %d" % len(asked), head)
    return head + b"\r\n\r\n" + asked


@dataclass(frozen=True, slots=True)
class Level:
    """One level's figures (milliseconds; CPU as a share of one core over the level's run)."""

    students: int
    answers: int
    errors: int
    tokens_per_s: float
    added_ttft_p50: float | None
    added_ttft_p99: float | None
    added_itl_p50: float | None
    added_itl_p99: float | None
    added_itl_max: float | None
    server_cpu: float
    client_cpu: float
    #: From the last token to ``done`` (the engine adds nothing there).
    added_end_p99: float | None = None
    first_error: str | None = None
    #: The added TTFT of the follow-ups alone (None: none asked).
    follow_up_ttft_p50: float | None = None
    follow_up_ttft_p99: float | None = None
    #: CPU per answer (ms) over the level by whose it was (``server``; through nginx also
    #: ``nginx``, ``PostgreSQL``, ``Redis``): the CPU over the whole run, warm-up included,
    #: over the answers measured, the same measure for every server.
    cpu_ms_per_answer: dict[str, float] = field(default_factory=dict)

    def passes(self, itl_limit_ms: float, ttft_limit_ms: float = TTFT_LIMIT_MS) -> bool:
        return (
            self.answers > 0
            and self.errors == 0
            and self.added_itl_p99 is not None
            and self.added_itl_p99 <= itl_limit_ms
            and self.added_ttft_p99 is not None
            and self.added_ttft_p99 <= ttft_limit_ms
            and (self.added_end_p99 is None or self.added_end_p99 <= itl_limit_ms)
        )


def _ms(values: list[float], q: float, less_ms: float) -> float | None:
    return round(percentile(values, q) * 1000 - less_ms, 1) if values else None


def level_figures(
    students: int,
    answers: Iterable[Answer],
    *,
    ttft_ms: float,
    itl_ms: float,
    measure_s: float,
    server_cpu_s: float,
    client_cpu_s: float,
    wall_s: float,
    cpu_by_role: Mapping[str, float] | None = None,
) -> Level:
    """Reduce a level's answers to its figures; the added latencies take the engine's own
    first-token delay and token gap off what the client saw. ``cpu_by_role``: the CPU seconds
    over the run by whose they were (default: all the server's)."""
    answers = list(answers)
    spent = {"server": server_cpu_s} if cpu_by_role is None else cpu_by_role
    failed = [a for a in answers if a.error]
    ok = [a for a in answers if not a.error]
    ttfts = [a.ttft_s for a in ok if a.ttft_s is not None]
    gaps = [gap for a in ok for gap in a.gaps_s]
    ends = [a.end_s for a in ok if a.end_s is not None]
    followed = [a.ttft_s for a in ok if a.ttft_s is not None and a.follow_up]
    return Level(
        students=students,
        answers=len(answers),
        errors=len(failed),
        tokens_per_s=round(sum(a.tokens for a in ok) / measure_s, 1),
        added_ttft_p50=_ms(ttfts, 50, ttft_ms),
        added_ttft_p99=_ms(ttfts, 99, ttft_ms),
        added_itl_p50=_ms(gaps, 50, itl_ms),
        added_itl_p99=_ms(gaps, 99, itl_ms),
        added_itl_max=_ms(gaps, 100, itl_ms),
        server_cpu=round(server_cpu_s / wall_s, 3),
        client_cpu=round(client_cpu_s / wall_s, 3),
        added_end_p99=_ms(ends, 99, 0),
        first_error=failed[0].error if failed else None,
        follow_up_ttft_p50=_ms(followed, 50, ttft_ms),
        follow_up_ttft_p99=_ms(followed, 99, ttft_ms),
        cpu_ms_per_answer={
            role: round(seconds * 1000 / len(answers), 3) for role, seconds in spent.items()
        }
        if answers
        else {},
    )


def standing_rows(turns: Sequence[tuple[str, Level]], *, peer: str = "uvicorn") -> list[str]:
    """Markdown rows: each server's CPU per answer at each number of students, the median of
    its turns (a server measured again in alternation, on a shared machine whose speed drifts)
    with their range, the server's process alone and all the box's, then the server's median
    over the ``peer``'s and over ``bare``'s at the same number of students, where measured."""
    by: dict[tuple[str, int], list[Level]] = {}
    for name, level in turns:
        if level.cpu_ms_per_answer:
            by.setdefault((name, level.students), []).append(level)

    def median(name: str, students: int, box: bool = False) -> float | None:
        levels = by.get((name, students))
        if not levels:
            return None
        return statistics.median(
            sum(lv.cpu_ms_per_answer.values()) if box else lv.cpu_ms_per_answer["server"]
            for lv in levels
        )

    rows = [
        "| server | students | turns | server CPU ms/answer, median (range) | the box's |"
        f" × {peer} | × bare |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (name, students), levels in sorted(by.items(), key=lambda item: (item[0][1], item[0][0])):
        own = sorted(lv.cpu_ms_per_answer["server"] for lv in levels)
        mine = statistics.median(own)
        ratios = [
            f"{mine / theirs:.2f}" if (theirs := median(other, students)) else "-"
            for other in (peer, "bare")
        ]
        rows.append(
            f"| {name} | {students} | {len(levels)} | {mine:.2f} ({own[0]:.2f}-{own[-1]:.2f})"
            f" | {median(name, students, box=True):.2f} | {ratios[0]} | {ratios[1]} |"
        )
    return rows


def next_level(
    passed: Iterable[int], failed: Iterable[int], *, start: int, most: int, resolution: float
) -> int | None:
    """The next number of students to try, or None when the search is over: doubling from
    ``start`` until a level fails (or ``most`` passes), then halving the interval between the
    largest pass and the smallest failure until it is within ``resolution`` (a fraction) of
    the pass."""
    passed, failed = sorted(passed), sorted(failed)
    low = passed[-1] if passed else 0
    high = failed[0] if failed else None
    if high is None:
        if not passed:
            return start
        return None if low >= most else min(low * 2, most)
    if low == 0:
        return None if high <= 1 else high // 2
    if high - low <= max(1, math.ceil(low * resolution)):
        return None
    return (low + high) // 2
