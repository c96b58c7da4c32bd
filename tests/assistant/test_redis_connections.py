"""A worker's connections to Redis do not grow with the answers it gives or the pages it serves,
under both servers.

Django makes a cache object per thread and, on the event loop, per task; each of its Redis cache
objects made its own client, so every answer (a cache call looked up on the event loop) and
every page view (the session middleware's ``SessionStore``) opened a new connection to Redis.
``assistant.cache.SharedRedisCache`` shares one client per process, and ``assistant.db.run_cache``
looks the cache up on a reader thread; under uvicorn a new question's admission and the one
command every answer sends at its end go from the event loop (``assistant/loop_redis.py``), which
Redis's ``MONITOR`` shows by the address that sent them. Redis counts every connection it accepts
(``total_connections_received``): once the worker is warm, more answers and more page views must
not add connections. The tests run alone against the machine's Redis, so nothing else connects
meanwhile but their own counter reads.
"""

import re
import socket
import threading
from datetime import datetime

import httpx
import pytest
import redis
from django.utils import timezone

from assistant.loop_redis import LOOP_CLIENT_NAME
from assistant.models import StreamRecord
from tests.support import REDIS_URL, ChatClient, redis_clients_named, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "[scripted tokens=3 ttft_ms=1 itl_ms=1] Hello"
#: Answers before counting (the worker's threads and pools start), then answers counted.
WARM, COUNTED = 10, 30


def connections_received() -> int:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.info("stats")["total_connections_received"])
    finally:
        client.close()


def answered(client: ChatClient, count: int, stored: int, since: datetime) -> None:
    """``count`` answers, each whole, and every record of a request since ``since`` stored (the
    stores use the cache too; an earlier test's worker may still be storing its own)."""
    for _ in range(count):
        events = client.ask(QUESTION)
        assert events[-1].event == "done", events[-3:]
    mine = StreamRecord.objects.filter(created_at__gte=since)
    assert wait_for(lambda: mine.count() == stored, timeout=30), (mine.count(), stored)


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_more_answers_open_no_more_connections_to_redis(
    worker_factory, server_kind: str, redis_prefix: str
) -> None:
    worker = worker_factory(
        CHATSITE_REDIS_URL=REDIS_URL, CHATSITE_REDIS_PREFIX=redis_prefix, CHATSITE_CHAT_RATE="1000"
    )
    client = ChatClient(worker)
    try:
        started = timezone.now()
        answered(client, WARM, WARM, started)
        before = connections_received()
        answered(client, COUNTED, WARM + COUNTED, started)
        opened = connections_received() - before - 1  # less the second counter read's own
    finally:
        client.close()
    # A few at most: a thread of a pool that had not run yet connects once. Per answer, 30.
    assert opened <= 3, f"{opened} connections to Redis for {COUNTED} answers"


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_more_page_views_open_no_more_connections_to_redis(
    worker_factory, server_kind: str, redis_prefix: str
) -> None:
    worker = worker_factory(CHATSITE_REDIS_URL=REDIS_URL, CHATSITE_REDIS_PREFIX=redis_prefix)
    with httpx.Client(base_url=worker.url, timeout=30) as browser:
        for _ in range(WARM):
            browser.get("/").raise_for_status()  # its session read from the cache each time
        before = connections_received()
        for _ in range(COUNTED):
            browser.get("/").raise_for_status()
        opened = connections_received() - before - 1
    assert opened <= 3, f"{opened} connections to Redis for {COUNTED} page views"


@pytest.mark.parametrize(("server_kind", "loop_commands"), [("daphne", []), ("uvicorn", ["zrem"])])
def test_answers_give_their_slots_back_from_uvicorns_event_loop(
    worker_factory, server_kind: str, loop_commands: list[str], redis_prefix: str
) -> None:
    """Under uvicorn each answer gives back its stream slot by the worker's event loop's own
    client (``assistant/loop_redis.py``, named in Redis's client list with the worker's process
    id), not from a reader thread; under Daphne from a reader thread, as before."""
    worker = worker_factory(
        CHATSITE_REDIS_URL=REDIS_URL, CHATSITE_REDIS_PREFIX=redis_prefix, CHATSITE_CHAT_RATE="1000"
    )
    client = ChatClient(worker)
    try:
        for _ in range(3):
            events = client.ask(QUESTION)
            assert events[-1].event == "done", events[-3:]
    finally:
        client.close()
    mine = redis_clients_named(f"{LOOP_CLIENT_NAME}-{worker.process.pid}")
    # Its one connection's last command gave a slot back.
    assert [c["cmd"] for c in mine] == loop_commands, mine


class _Monitor:
    """Every command Redis runs while it watches (``MONITOR``), with the address that sent it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._socket = socket.create_connection(("127.0.0.1", redis_port()))
        self._socket.sendall(b"MONITOR\r\n")
        self._file = self._socket.makefile("rb")
        assert self._file.readline() == b"+OK\r\n"
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._file:
                self.lines.append(line.decode("utf-8", "replace"))
        except (OSError, ValueError):
            pass

    def stop(self) -> list[tuple[str, list[str]]]:
        """(the sender's address, the command's words), for each command seen."""
        self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        self._socket.close()
        seen = []
        for line in self.lines:
            found = re.match(r"\+\S+ \[\d+ (\S+)\] (.*)", line.strip())
            words = re.findall(r'"((?:[^"\\]|\\.)*)"', found[2]) if found else []
            if found and words:
                seen.append((found[1], [words[0].lower(), *words[1:]]))
        return seen


def redis_port() -> int:
    return redis.connection.parse_url(REDIS_URL).get("port", 6379)


@pytest.mark.parametrize(("server_kind", "on_loop"), [("daphne", False), ("uvicorn", True)])
def test_new_questions_are_admitted_by_uvicorns_event_loop(
    worker_factory, server_kind: str, on_loop: bool, redis_prefix: str
) -> None:
    """Under uvicorn a new question's session read and its try for a stream slot are sent by
    the worker's event loop's own client (``services/loop_admission.py``); under Daphne from a
    reader thread, as before."""
    worker = worker_factory(
        CHATSITE_REDIS_URL=REDIS_URL, CHATSITE_REDIS_PREFIX=redis_prefix, CHATSITE_CHAT_RATE="1000"
    )
    client = ChatClient(worker)
    monitor = None
    try:
        assert client.ask(QUESTION)[-1].event == "done"  # the session made, the worker warm
        monitor = _Monitor()
        for _ in range(3):
            assert client.ask(QUESTION)[-1].event == "done"
    finally:
        seen = monitor.stop() if monitor is not None else []
        client.close()
    named = redis_clients_named(f"{LOOP_CLIENT_NAME}-{worker.process.pid}")
    loop_addresses = {c["addr"] for c in named}
    takes = [
        address
        for address, words in seen
        if words[:1] == ["evalsha"] and ":chat:slots:" in words[3]
    ]
    session_reads = [
        address
        for address, words in seen
        if words[:1] == ["get"] and "sessions.cached_db" in words[1]
    ]
    assert len(takes) == 3, seen
    assert session_reads, seen
    by_loop = [address in loop_addresses for address in [*takes, *session_reads]]
    assert by_loop == [on_loop] * len(by_loop), (loop_addresses, takes, session_reads)
