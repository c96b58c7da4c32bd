"""What a crowd is told when it asks more of the site than the site serves at once.

Every answer is sorted into one of four kinds:

* ``served``: the page (200), or an answer streamed to its ``done`` event;
* ``refused``: told to come back, the right way: 503 or 429 with a ``Retry-After`` the page
  can wait for, and a body that says why: a JSON error (``{"error": {"code": ...}}``), or, to a
  browser's navigation (``Accept: text/html``), the busy page that loads itself again after
  that many seconds. An answer that began and was then stopped for another student's sake
  (the ``fair_share`` and ``unheard`` error events) is a refusal too: the page asks again;
* ``wrong``: anything else: a 502, a 504, a 500, a refusal the page cannot wait for, a reset or
  refused connection, no answer in time, a stream cut without its last event.
"""

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import httpx

from .client import Sample, Student, _ssl_context

Kind = Literal["served", "refused", "stopped", "wrong"]
KINDS: tuple[Kind, ...] = ("served", "refused", "stopped", "wrong")
REFUSALS = frozenset({429, 503})
#: The error events that stop an answer for another student's sake.
GIVEN_UP = frozenset({"fair_share", "unheard"})
#: What a browser sends with a navigation.
NAVIGATION_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
#: How long a student whose answer was stopped waits before pressing Retry.
STOPPED_RETRY_S = 1
_REFRESH = re.compile(r'<meta http-equiv="refresh" content="(\d+)"')


@dataclass(frozen=True, slots=True)
class Answer:
    kind: Kind
    #: What was answered: "200", "503 engine_busy", "502 text/html", "ConnectError", ...
    label: str
    #: Seconds the client was told to wait (refusals), or waits before Retry (stopped).
    wait_s: int | None = None
    ms: float = 0.0


def retry_after_s(value: str | None) -> int | None:
    """A ``Retry-After`` the page counts down from: whole seconds, at least 1 (the site never
    sends an HTTP-date); None for anything else."""
    if value is None or not value.strip().isdigit():
        return None
    return max(1, int(value.strip()))


def _json_code(text: str) -> str | None:
    try:
        code = json.loads(text)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) and code else None


def response_sort(
    status: int, headers: Mapping[str, str], body: str, *, navigation: bool = False
) -> Answer:
    """One whole (non-streamed) answer. ``navigation``: the request was a browser's page load,
    for which the busy page is as right as a JSON error."""
    content_type = headers.get("content-type", "").split(";")[0].strip()
    if status == 200:
        return Answer("served", "200")
    code = _json_code(body) if content_type == "application/json" else None
    label = f"{status} {code or content_type or 'no body type'}"
    wait = retry_after_s(headers.get("retry-after"))
    if status not in REFUSALS or wait is None:
        return Answer("wrong", label + ("" if status not in REFUSALS else ", no Retry-After"))
    if code is not None:
        return Answer("refused", label, wait)
    refresh = _REFRESH.search(body)
    if navigation and content_type == "text/html" and refresh and int(refresh[1]) == wait:
        return Answer("refused", f"{status} busy page", wait)
    return Answer("wrong", label + ", neither a JSON error nor the busy page")


def sample_sort(sample: Sample) -> Answer:
    """One question, as the benchmark client read it (``Student.ask``)."""
    ms = sample.e2e_ms or 0.0
    if sample.outcome == "ok":
        return Answer("served", "answered", ms=ms)
    if sample.outcome == "error_event" and sample.error in GIVEN_UP:
        return Answer("stopped", sample.error or "", STOPPED_RETRY_S, ms)
    if sample.outcome == "http_error" and sample.status in REFUSALS:
        code = (sample.error or "").partition(" ")[2]
        wait = retry_after_s(sample.retry_after)
        if code and code.isidentifier() and wait is not None:
            return Answer("refused", sample.error or "", wait, ms)
        return Answer("wrong", f"{sample.error}, no Retry-After or no JSON error", ms=ms)
    return Answer("wrong", sample.label, ms=ms)


async def visit(
    url: str, *, source: str | None = None, within_s: float = 60.0, navigation: bool = True
) -> tuple[Answer, httpx.Cookies]:
    """One new browser loading ``url``: the answer (``wrong`` after ``within_s`` without one),
    and the cookies it was given."""
    # One TLS context for all (building one costs 50-100 ms of CPU).
    transport = httpx.AsyncHTTPTransport(local_address=source, verify=_ssl_context())
    headers = {"Accept": NAVIGATION_ACCEPT if navigation else "*/*"}
    sent = time.perf_counter()
    async with httpx.AsyncClient(timeout=within_s, transport=transport, headers=headers) as client:
        try:
            async with asyncio.timeout(within_s):
                response = await client.get(url)
        except TimeoutError:
            return Answer("wrong", "no answer in time", ms=_since(sent)), client.cookies
        except httpx.HTTPError as exc:
            return Answer("wrong", type(exc).__name__, ms=_since(sent)), client.cookies
        answer = response_sort(
            response.status_code, response.headers, response.text, navigation=navigation
        )
        return _timed(answer, sent), client.cookies


async def visit_until_served(url: str, *, source: str | None, deadline: float) -> list[Answer]:
    """A new browser loading ``url`` as the busy page has it do: after a refusal, again once
    its Retry-After has passed, until served or the ``deadline`` (``time.perf_counter()``).
    Every answer, in order."""
    answers: list[Answer] = []
    while True:
        answers.append(answer := (await visit(url, source=source))[0])
        wait = answer.wait_s
        if answer.kind != "refused" or wait is None or time.perf_counter() + wait > deadline:
            return answers
        await asyncio.sleep(wait)


async def ask_until_served(student: Student, prompt: str, *, deadline: float) -> list[Answer]:
    """Ask as the page does: after a refusal, wait as told and ask again (and after an answer
    stopped for another's sake, Retry a second later), until an answer or the ``deadline``
    (``time.perf_counter()``). Every answer, in order."""
    answers: list[Answer] = []
    while True:
        answers.append(answer := sample_sort(await student.ask(prompt)))
        wait = answer.wait_s
        if answer.kind in ("served", "wrong") or wait is None:
            return answers
        if time.perf_counter() + wait > deadline:
            return answers
        await asyncio.sleep(wait)


def answer_counts(answers: list[Answer]) -> dict[str, dict[str, int]]:
    """Counts by kind, then by label within each kind."""
    counts: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
    for answer in answers:
        counts[answer.kind][answer.label] += 1
    return {kind: dict(labels.most_common()) for kind, labels in counts.items()}


def _since(sent: float) -> float:
    return round((time.perf_counter() - sent) * 1000, 1)


def _timed(answer: Answer, sent: float) -> Answer:
    return Answer(answer.kind, answer.label, answer.wait_s, _since(sent))
