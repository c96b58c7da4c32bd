"""Overload through the real nginx (deploy/nginx/chatsite.conf) and real Daphne workers: whatever
a burst asks, every answer is served or refused the way the page waits for, 503 or 429 with
Retry-After (assistant/benchmarking/overload.py sorts them), never a 502, a 504, a 500 page or a
reset; and everyone refused is served once they come back as told.

The limits are lowered so that a burst a test can afford goes past them: a worker runs one page
at a time and lets none wait (CHATSITE_PAGES_AT_ONCE=1, CHATSITE_PAGES_WAIT_S=0), an engine
streams four answers. benchmarks/overload.py runs the same bursts at 1,000 with every limit as
shipped.
"""

import asyncio
import json
import secrets
import subprocess
import time

import pytest
from django.db import connection

from assistant.benchmarking.client import Student
from assistant.benchmarking.overload import (
    NAVIGATION_ACCEPT,
    Answer,
    answer_counts,
    ask_until_served,
    response_sort,
    visit,
    visit_until_served,
)
from assistant.benchmarking.ports import free_port
from tests.support import LiveServer, NginxServer, raw_request

pytestmark = pytest.mark.django_db(transaction=True)

#: Loopback addresses the crowd comes from, a class on each.
ADDRESSES = ("127.0.3.1", "127.0.3.2", "127.0.3.3")
#: How long the refused have to come back and be served: a sanity bound, not a measurement.
CAP_S = 90


def _wrong(answers: list[Answer]) -> dict[str, int]:
    return answer_counts(answers)["wrong"]


def _plain_get(port: int, path: str, accept: str) -> tuple[int, dict[str, str], str]:
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {accept}\r\n"
    return _exchange(port, request + "Connection: close\r\n\r\n")


def _exchange(port: int, request: str) -> tuple[int, dict[str, str], str]:
    sock = raw_request(port, request.encode())
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body.decode()


@pytest.mark.parametrize(
    "site_file", ["chatsite.conf", "chatsite-split.conf", "chatsite-servers.conf"]
)
def test_no_worker_answering_is_a_503_the_page_waits_for(nginx_factory, site_file: str) -> None:
    """Every worker gone (nothing listens on their ports; in chatsite-servers.conf, those of
    both pools): nginx's own 502 becomes a 503 with Retry-After, as a page and as JSON, on
    every kind of location."""
    pool = [free_port()] if site_file == "chatsite-servers.conf" else []
    site = nginx_factory(site_file, [free_port(), free_port()], uvicorn_workers=pool)
    page = _plain_get(site.port, "/", NAVIGATION_ACCEPT)
    answer = response_sort(*page, navigation=True)
    assert answer.kind == "refused", answer
    assert answer.label == "503 busy page"
    assert "请稍候" in page[2] and "One moment" in page[2]
    for path in ("/api/conversations", "/api/chat/resume"):
        answer = response_sort(*_plain_get(site.port, path, "*/*"))
        assert (answer.kind, answer.label) == ("refused", "503 site_unavailable"), path
    body = json.dumps({"message": "hi", "conversation": None})
    question = (
        f"POST /api/chat/stream HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    )
    answer = response_sort(*_exchange(site.port, question))
    assert (answer.kind, answer.label) == ("refused", "503 site_unavailable")
    status, headers, text = _plain_get(site.port, "/v1/models", "*/*")
    assert (status, json.loads(text)["error"]["type"]) == (503, "service_unavailable")
    assert 2 <= int(headers["retry-after"]) <= 6


@pytest.fixture(scope="module")
def crowded(daphne_factory, nginx_factory) -> tuple[NginxServer, list[LiveServer]]:
    """Two workers that run one page at a time, letting none wait, and stream four answers
    each (50 ms to the first token, then 20 tokens 20 ms apart), behind nginx."""
    env = {
        "CHATSITE_PAGES_AT_ONCE": "1",
        "CHATSITE_PAGES_WAIT_S": "0",
        "CHATSITE_MAX_STREAMS": "4",
        "CHATSITE_SCRIPTED_TOKENS": "20",
    }
    workers = [daphne_factory(**env), daphne_factory(**env)]
    return nginx_factory("chatsite.conf", [w.port for w in workers]), workers


def test_workers_listen_with_a_long_backlog(crowded) -> None:
    """Twisted's own backlog is 50; a worker's is CHATSITE_LISTEN_BACKLOG (2048), as `ss` shows
    it (the Send-Q of a listening socket)."""
    _, workers = crowded
    # The kernel caps a backlog at net.core.somaxconn (4096 since Linux 5.4, 128 before).
    somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
    for worker in workers:
        shown = subprocess.run(
            ["ss", "-Hltn", f"sport = :{worker.port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert int(shown[2]) == min(2048, somaxconn), shown


def test_a_burst_of_first_visits_is_served_or_told_to_wait(crowded) -> None:
    site, _ = crowded
    deadline = time.perf_counter() + CAP_S

    async def burst() -> list[list[Answer]]:
        url = f"http://127.0.0.1:{site.port}/"
        browsers = (
            visit_until_served(url, source=ADDRESSES[n % len(ADDRESSES)], deadline=deadline)
            for n in range(120)
        )
        return await asyncio.gather(*browsers)

    runs = asyncio.run(burst())
    tries = [a for answers in runs for a in answers]
    assert _wrong(tries) == {}
    first = answer_counts([answers[0] for answers in runs])
    assert first["refused"].get("503 busy page", 0) > 0, first  # the line did refuse
    assert all(a.wait_s is not None and 2 <= a.wait_s <= 6 for a in tries if a.kind == "refused")
    assert [answers[-1].kind for answers in runs] == ["served"] * 120


def test_a_burst_of_questions_is_answered_or_told_to_wait(crowded) -> None:
    """40 students, pages loaded, ask at the same moment of two workers with four seats each;
    the refused ask again after their Retry-After, as the page does."""
    site, _ = crowded

    async def burst() -> list[list[Answer]]:
        url = f"http://127.0.0.1:{site.port}"
        students = [
            Student(base_url=url, source=ADDRESSES[n % len(ADDRESSES)], timeout=30)
            for n in range(40)
        ]
        try:
            for student in students:  # one at a time: the line lets none wait
                for _ in range(20):
                    if (await student.client.get(student.page_url)).status_code == 200:
                        break
                    await asyncio.sleep(0.2)
            deadline = time.perf_counter() + CAP_S
            return await asyncio.gather(
                *(ask_until_served(s, "Why is the sky blue?", deadline=deadline) for s in students)
            )
        finally:
            await asyncio.gather(*(s.aclose() for s in students))

    runs = asyncio.run(burst())
    assert _wrong([a for answers in runs for a in answers]) == {}
    first = answer_counts([answers[0] for answers in runs])
    # 40 asking of 8 seats: most are refused (503 engine_busy) or, once begun, stopped for
    # another class's fair share; each came back as told.
    assert sum(first["refused"].values()) + sum(first["stopped"].values()) > 0, first
    assert [answers[-1].kind for answers in runs] == ["served"] * 40


def test_a_database_pool_that_gives_no_connection_is_a_503_not_a_500(
    daphne_factory, nginx_factory
) -> None:
    """PostgreSQL only (SQLite has no pool): one connection per worker, waited for 50 ms, and no
    page line in front; a burst of first visits that must wait for it gets the busy page with
    Retry-After (database_unavailable), never Django's 500 page."""
    if connection.vendor != "postgresql":
        pytest.skip("the pool is PostgreSQL's (the PostgreSQL run of the suite runs this)")
    worker = daphne_factory(
        CHATSITE_DB_POOL_SIZE="1",
        CHATSITE_DB_POOL_TIMEOUT="0.05",
        CHATSITE_PAGES_AT_ONCE="0",
        # As in production: with DEBUG on, Django shows its debug page for any exception.
        CHATSITE_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(38)[:50],
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
    )
    site = nginx_factory("chatsite.conf", [worker.port])

    async def burst() -> list[Answer]:
        url = f"http://127.0.0.1:{site.port}/"
        visits = (visit(url, source=ADDRESSES[n % len(ADDRESSES)]) for n in range(80))
        return [answer for answer, _ in await asyncio.gather(*visits)]

    answers = asyncio.run(burst())
    counts = answer_counts(answers)
    assert counts["wrong"] == {}
    assert counts["refused"].get("503 busy page", 0) > 0, counts
