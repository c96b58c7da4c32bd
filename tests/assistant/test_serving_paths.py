"""The two serving paths and the split between them, on real Daphne processes.

The "candidate" engine below is the scripted one with a longer first-token delay: the stand-in
for a slower serving configuration (a second vLLM server, say, which cannot run here).
"""

import json
import re
import time

import pytest

from assistant.benchmarking import SSEParser
from assistant.models import BreakerEvent, Message, StreamRecord
from assistant.services.serving_state import bucket_of
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def normalised(body: bytes) -> bytes:
    """The stream with what must differ between two requests replaced: ids, path, timings."""
    first = SSEParser().feed(body)[0]
    assert first.event == "meta", first
    meta = json.loads(first.data)
    for key in ("request_id", "conversation", "message", "user_message", "path"):
        body = body.replace(meta[key].encode(), f"<{key}>".encode())
    return re.sub(rb'"timings":\{[^}]*\}', b'"timings":{}', body)


def test_both_paths_send_the_same_bytes_and_store_the_same_rows(chat_client: ChatClient) -> None:
    message = {"message": "[scripted tokens=6 ttft_ms=20 itl_ms=5] Same answer?"}
    bodies, metas = {}, {}
    for path in ("direct", "django"):
        response = chat_client.raw(message, path=f"/api/chat/stream/{path}")
        assert response.status == 200
        assert response.header("content-type") == "text/event-stream; charset=utf-8"
        bodies[path] = response.body()
        events = SSEParser().feed(bodies[path])
        assert [events[0].event, events[-1].event] == ["meta", "done"], events
        metas[path] = json.loads(events[0].data)
        assert metas[path]["path"] == path
    assert normalised(bodies["direct"]) == normalised(bodies["django"])

    def stored(path: str) -> tuple:
        meta = metas[path]
        record = wait_for(
            lambda: StreamRecord.objects.filter(request_id=meta["request_id"]).first()
        )
        messages = Message.objects.filter(conversation_id=meta["conversation"])
        return (
            list(messages.values_list("role", "content", "status", "finish_reason")),
            (record.outcome, record.engine, record.tokens, record.owner_key, record.error_code),
            # Every stage was timed on both paths.
            [
                getattr(record, f) is None
                for f in ("parse_ms", "queue_ms", "engine_ttft_ms", "server_ttft_ms", "e2e_ms")
            ],
        )

    assert stored("direct") == stored("django")
    assert stored("direct")[2] == [False] * 5


def test_gzip_never_touches_an_event_stream(daphne_factory) -> None:
    """With compression on, pages are gzipped and the stream is not, on both paths."""
    server: LiveServer = daphne_factory(CHATSITE_GZIP="1")
    client = ChatClient(server)
    try:
        page = client.client.get("/", headers={"Accept-Encoding": "gzip"})
        assert page.headers["content-encoding"] == "gzip"
        for path in ("direct", "django"):
            response = client.raw(
                {"message": "[scripted tokens=8 itl_ms=40]"},
                headers={"Accept-Encoding": "gzip"},
                path=f"/api/chat/stream/{path}",
            )
            assert response.header("content-encoding") is None
            arrivals = [e.at for e in response.events() if e.event == "token"]
            assert arrivals[-1] - arrivals[0] > 0.2  # spread out, not one block at the end
    finally:
        client.close()


def clients_by_path(server: LiveServer, percent: float, each: int) -> dict[str, list[ChatClient]]:
    """Students (sessions) grouped by the path their session hashes to, ``each`` per path."""
    groups: dict[str, list[ChatClient]] = {"direct": [], "django": []}
    for _ in range(20 * each):
        client = ChatClient(server)
        group = groups["django" if bucket_of(client.session_key) < percent * 100 else "direct"]
        if len(group) < each:
            group.append(client)
        else:
            client.close()
        if all(len(g) == each for g in groups.values()):
            return groups
    raise AssertionError("the sessions' buckets are not spread over both paths")


def paths_of(client: ChatClient, message: str, times: int = 1) -> set[str]:
    return {client.ask(message)[0].json()["path"] for _ in range(times)}


def test_the_split_routes_each_session_to_its_bucket_every_time(daphne_factory) -> None:
    server = daphne_factory(CHATSITE_CANDIDATE_PERCENT="50")
    groups = clients_by_path(server, 50, 6)
    for path, clients in groups.items():
        for client in clients:
            assert paths_of(client, "[scripted tokens=1 ttft_ms=0]", times=2) == {path}
            client.close()


BREAKER_ENV = {
    # Far enough apart that the django path's own overhead (tens of ms on a loaded machine)
    # cannot blur them: 100 ms baseline, 400 ms candidate, 50 ms for the recovered candidate.
    "CHATSITE_SCRIPTED_TTFT_MS": "100",
    "CHATSITE_SCRIPTED_ITL_MS": "0",
    "CHATSITE_SCRIPTED_TOKENS": "2",
    "CHATSITE_CANDIDATE_ENGINE": "scripted",
    "CHATSITE_CANDIDATE_SCRIPTED_TTFT_MS": "400",
    "CHATSITE_CANDIDATE_SCRIPTED_ITL_MS": "0",
    "CHATSITE_CANDIDATE_SCRIPTED_TOKENS": "2",
    "CHATSITE_DJANGO_ENGINE_ALIAS": "candidate",
    "CHATSITE_CANDIDATE_PERCENT": "50",
    "CHATSITE_BREAKER_MIN_SAMPLES": "8",
    "CHATSITE_BREAKER_HALF_OPEN_SAMPLES": "4",
    "CHATSITE_BREAKER_HALF_OPEN_PERCENT": "50",
    "CHATSITE_BREAKER_COOLDOWN_S": "2",
    "CHATSITE_BREAKER_EVALUATE_S": "0.3",
    "CHATSITE_SPLIT_REFRESH_S": "0.2",
}


def test_a_slow_candidate_trips_the_breaker_for_every_process_then_recovers(
    daphne_factory,
) -> None:
    first: LiveServer = daphne_factory(**BREAKER_ENV)
    second: LiveServer = daphne_factory(**BREAKER_ENV)
    groups = clients_by_path(first, 50, 4)
    slow, fast = groups["django"], groups["direct"]

    # 7 streams a side: fewer than the minimum, so the 4x slower candidate cannot trip it yet.
    for i in range(7):
        assert paths_of(slow[i % 4], "Why?") == {"django"}
        assert paths_of(fast[i % 4], "Why?") == {"direct"}
    time.sleep(1)
    assert not BreakerEvent.objects.filter(kind="tripped").exists()

    for client in (slow[0], fast[0]):
        client.ask("Why?")
    tripped = wait_for(lambda: BreakerEvent.objects.filter(kind="tripped").first(), timeout=15)
    figures = tripped.figures
    assert figures["candidate"]["p95_ms"] > 1.2 * figures["baseline"]["p95_ms"]
    assert figures["candidate"]["samples"] >= 8 and figures["baseline"]["samples"] >= 8

    # Within two seconds every process sends the candidate's students to the baseline.
    time.sleep(0.5)
    assert paths_of(slow[1], "Why?", times=2) == {"direct"}
    on_second = ChatClient(second)
    on_second.client.cookies.set("sessionid", slow[2].session_key)
    assert paths_of(on_second, "Why?") == {"direct"}

    # After the cool-down, half-open: the candidate's students try it again. Fast answers
    # (the directive overrides the slow engine's delay) close the breaker.
    wait_for(lambda: BreakerEvent.objects.filter(kind="half_open").exists(), timeout=15)
    time.sleep(0.5)
    for i in range(4):
        assert paths_of(slow[i], "[scripted ttft_ms=50 tokens=2] Why?") == {"django"}
    closed = wait_for(lambda: BreakerEvent.objects.filter(kind="closed").first(), timeout=15)
    assert closed.breaker == "closed"
    for client in [*slow, *fast, on_second]:
        client.close()
