"""Faults with real components: PostgreSQL stopped and started again under a running worker, the
model server killed mid-answer, an upstream that never answers, a worker stopped mid-answer.

Each fault is caused for real (``pg_ctl stop``, SIGKILL, SIGTERM), against Daphne on loopback,
and judged by what a student sees on the wire and what ends up in the database. vLLM needs a
GPU, so llama.cpp's own OpenAI-compatible server stands in for it, as in the engine tests. Time
bounds are generous sanity checks for a busy machine.
"""

import secrets
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from assistant.models import StreamRecord
from assistant.services.identity import session_pseudonym
from tests.assistant.faults_support import (
    SilentUpstream,
    ThrowawayPostgres,
    assert_partial_answer_kept,
    kinds,
    metric,
    postgres_bin,
    text_of,
)
from tests.support import ChatClient, LiveServer, ModelServer, start_daphne, wait_for

PERSIST_FAILURES = "ai_persistence_failures_total"
CONNECTION_ERRORS = "ai_sse_connection_errors_total"


# --- PostgreSQL goes away --------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayPostgres]:
    """A migrated PostgreSQL of this module's own (never the shared one on 5432)."""
    if postgres_bin("initdb") is None:
        pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    server = ThrowawayPostgres()
    try:
        server.create()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def postgres(cluster: ThrowawayPostgres) -> Iterator[ThrowawayPostgres]:
    """The module's PostgreSQL, running when the test starts and again when it ends."""
    if not cluster.running():
        cluster.start()
    yield cluster
    if not cluster.running():
        cluster.start()


@pytest.fixture(scope="module")
def pg_worker(
    cluster: ThrowawayPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., LiveServer]]:
    """Start Daphne (scripted engine) on the throwaway PostgreSQL with a local-memory cache, so
    a session created while the database is up stays in the worker's cache."""
    workdir = tmp_path_factory.mktemp("pg-workers")
    servers: list[LiveServer] = []

    def start(**env: str) -> LiveServer:
        env = {"DATABASE_URL": cluster.url, "CHATSITE_REDIS_URL": "", **env}
        server = start_daphne(workdir=workdir, db_path=cluster.dbname, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def short_budget(pg_worker: Callable[..., LiveServer]) -> LiveServer:
    """A worker that keeps retrying a write for one second only."""
    return pg_worker(CHATSITE_PERSIST_RETRY_S="1")


def stored_exchange(postgres: ThrowawayPostgres, meta: dict[str, str]) -> list[tuple] | None:
    """The messages of ``meta``'s conversation, once its stream record is stored too."""
    record = postgres.query(
        "SELECT 1 FROM assistant_streamrecord WHERE request_id = %s", meta["request_id"]
    )
    if not record:
        return None
    return postgres.query(
        "SELECT id::text, role, content, status FROM assistant_message "
        "WHERE conversation_id = %s ORDER BY created_at",
        meta["conversation"],
    )


def given_up(server: LiveServer, row_id: str) -> bool:
    """Whether the worker's log names ``row_id`` among rows it could not store."""
    return any("Could not store" in line and row_id in line for line in server.log().splitlines())


def test_an_outage_mid_lesson_loses_nothing_once_the_database_is_back(
    postgres: ThrowawayPostgres, pg_worker: Callable[..., LiveServer]
) -> None:
    """PostgreSQL stops after the page loaded: the answer still streams to its end (the session
    comes from the worker's cache). PostgreSQL comes back within CHATSITE_PERSIST_RETRY_S: the
    question and the answer are stored, and the retries are counted, nothing as lost."""
    server = pg_worker(CHATSITE_PERSIST_RETRY_S="60")
    client = ChatClient(server)
    try:
        postgres.stop()
        question = "[scripted tokens=6 itl_ms=10] What is a cell?"
        events = client.ask(question)
        assert kinds(events) == ["meta"] + ["token"] * 6 + ["done"], events
        meta = events[0].json()
        # Down until the writer has met the outage (a connection pool may hold each try for
        # its own timeout first), then back well within the budget.
        wait_for(lambda: metric(server, PERSIST_FAILURES, kind="retried") > 0, timeout=30)
        postgres.start()

        rows = wait_for(lambda: stored_exchange(postgres, meta), timeout=30, interval=0.2)
        assert rows == [
            (meta["user_message"], "user", question, "complete"),
            (meta["message"], "assistant", text_of(events), "complete"),
        ]
        [(owner, outcome)] = postgres.query(
            "SELECT c.owner_key, r.outcome FROM assistant_conversation c "
            "JOIN assistant_streamrecord r ON r.conversation_id = c.id WHERE c.id = %s",
            meta["conversation"],
        )
        assert (owner, outcome) == (f"session:{session_pseudonym(client.session_key)}", "ok")
        assert metric(server, PERSIST_FAILURES, kind="lost") == 0
        assert "Could not store" not in server.log()
    finally:
        client.close()
        server.stop()


def test_an_outage_longer_than_the_retry_budget_is_logged_and_counted(
    postgres: ThrowawayPostgres, short_budget: LiveServer
) -> None:
    """With a one-second budget and PostgreSQL kept down, the answer still streams; then, within
    seconds, the worker gives the rows up loudly: "Could not store" naming the question and the
    answer, and ai_persistence_failures_total{kind="lost"} counts it."""
    server = short_budget
    client = ChatClient(server)
    try:
        postgres.stop()
        events = client.ask("[scripted tokens=4 itl_ms=10] What is an atom?")
        assert kinds(events) == ["meta"] + ["token"] * 4 + ["done"], events
        meta = events[0].json()
        ended = time.monotonic()

        lost_rows = [meta["user_message"], meta["conversation"], meta["message"]]
        wait_for(lambda: all(given_up(server, row) for row in lost_rows), timeout=30)
        waited = time.monotonic() - ended
        assert metric(server, PERSIST_FAILURES, kind="lost") >= 1
        # A budget of 1 s, with generous slack for a busy machine.
        assert waited < 8, f"rows given up {waited:.1f} s after the answer ended"
    finally:
        client.close()


def test_a_new_visitor_during_an_outage_gets_503_database_unavailable(
    postgres: ThrowawayPostgres, short_budget: LiveServer
) -> None:
    """A visitor this worker has no session for, while PostgreSQL is down, is told 503
    database_unavailable with Retry-After on both serving paths, not a 500, and before the
    page's 5 s first-byte watchdog would give up on the request. (One without a session
    cookie at all needs no database to be refused: 403 session_required.)"""
    server = short_budget
    postgres.stop()
    token = secrets.token_hex(16)
    strangers = {"session from elsewhere": {"sessionid": secrets.token_hex(16)}}
    asks = [
        (who, url, cookies)
        for who, cookies in strangers.items()
        for url in ("/api/chat/stream", "/api/chat/stream/django")
    ]

    def ask(who: str, url: str, cookies: dict[str, str]) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = httpx.post(
            server.url + url,
            json={"message": "Hello?", "conversation": None},
            headers={"X-CSRFToken": token},
            cookies={"csrftoken": token, **cookies},
            timeout=60,
        )
        return response, time.monotonic() - started

    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(lambda a: ask(*a), asks))
    waits = {}
    for (who, url, _), (response, waited) in zip(asks, answers, strict=True):
        assert response.status_code == 503, (who, url, response.text)
        assert response.headers["content-type"] == "application/json", (who, url)
        assert response.json()["error"]["code"] == "database_unavailable", (who, url)
        assert response.headers["retry-after"] == "5", (who, url)
        waits[f"{who}, {url}"] = round(waited, 1)
    assert max(waits.values()) < 5, f"seconds to the 503: {waits}"
    assert "Database unavailable before" in server.log()
    for url in ("/api/chat/stream", "/api/chat/stream/django"):
        response, _ = ask("no session", url, {})
        assert response.status_code == 403, (url, response.text)
        assert response.json()["error"]["code"] == "session_required", url


# --- The engine fails ------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.django_db(transaction=True)
def test_the_model_server_dying_mid_answer_ends_the_stream_with_an_error(
    daphne_factory, tmp_path: Path
) -> None:
    """SIGKILL to the model server after three tokens: the stream ends with event: error within
    seconds, the partial answer is saved as partial, the record says engine_error and /metrics
    counts it. With the server gone, the next question fails within 2 s as engine_unavailable."""
    model = ModelServer(tmp_path / "model-server.log")
    try:
        server = daphne_factory(
            CHATSITE_ENGINE="openai-http",
            CHATSITE_VLLM_URL=model.base_url,
            CHATSITE_VLLM_MODEL=model.model,
            CHATSITE_MAX_TOKENS="400",
            CHATSITE_TEMPERATURE="0",
        )
        first = ChatClient(server)
        try:
            stream = first.raw(
                {"message": "Write a long, detailed story about a dragon who learns to read."}
            ).events()
            events = [next(stream)]
            while len([e for e in events if e.event == "token"]) < 3:
                events.append(next(stream))
            model.kill()
            killed = time.monotonic()
            events += list(stream)
            ended = time.monotonic()
        finally:
            first.close()
    finally:
        model.kill()

    assert events[0].event == "meta"
    assert kinds(events)[-1] == "error", kinds(events)
    assert ended - killed < 5
    error = events[-1].json()
    assert error["code"] == "upstream_closed"
    assert "stopped unexpectedly" in error["message"]
    assert_partial_answer_kept(events, "upstream_closed")
    assert metric(server, CONNECTION_ERRORS, reason="upstream_closed") == 1

    second = ChatClient(server)
    try:
        started = time.monotonic()
        events = second.ask("What is a cell?")
        waited = time.monotonic() - started
    finally:
        second.close()
    assert kinds(events) == ["meta", "error"], events
    assert events[1].json()["code"] == "engine_unavailable"
    assert waited < 2
    assert metric(server, CONNECTION_ERRORS, reason="engine_unavailable") == 1
    record = wait_for(
        lambda: StreamRecord.objects.filter(request_id=events[0].json()["request_id"]).first()
    )
    assert (record.outcome, record.error_code) == ("engine_error", "engine_unavailable")


@pytest.mark.django_db(transaction=True)
def test_an_upstream_that_never_answers_times_out_the_first_token(daphne_factory) -> None:
    """An engine server that accepts the connection and then says nothing: after
    CHATSITE_FIRST_TOKEN_TIMEOUT (1 s) the student gets event: error first_token_timeout, the
    record says timeout, and the upstream request is hung up rather than left open."""
    with SilentUpstream() as upstream:
        server = daphne_factory(
            CHATSITE_ENGINE="openai-http",
            CHATSITE_VLLM_URL=upstream.url,
            CHATSITE_VLLM_MODEL="silent",
            CHATSITE_FIRST_TOKEN_TIMEOUT="1",
        )
        client = ChatClient(server)
        try:
            started = time.monotonic()
            events = client.ask("Hello?")
            waited = time.monotonic() - started
        finally:
            client.close()
        assert kinds(events) == ["meta", "error"], events
        assert events[1].json()["code"] == "first_token_timeout"
        assert 0.9 <= waited < 3
        assert upstream.accepted >= 1
        wait_for(lambda: upstream.closed >= upstream.accepted, timeout=3)
    record = wait_for(
        lambda: StreamRecord.objects.filter(request_id=events[0].json()["request_id"]).first()
    )
    assert (record.outcome, record.error_code) == ("timeout", "first_token_timeout")
    assert metric(server, CONNECTION_ERRORS, reason="first_token_timeout") == 1


# --- The worker is restarted -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
@pytest.mark.parametrize("path", ["direct", "django"])
def test_a_worker_stopped_mid_answer_keeps_the_question_and_the_partial_answer(
    worker_factory, daphne: LiveServer, path: str, server_kind: str
) -> None:
    """SIGTERM to a worker streaming a long answer: the student's stream ends (no hang), the
    engine is stopped, the worker exits, and a new worker on the same database shows the
    question and the partial answer (status partial) in GET /api/conversations/<id>. Under
    uvicorn too: its graceful shutdown cancels the answer after CHATSITE_DRAIN_S, and the
    lifespan protocol's shutdown stores what it leaves (assistant/lifespan.py)."""
    old = worker_factory()
    tag = f"sigterm-{path}-{server_kind}"
    client = ChatClient(old)
    try:
        stream = client.raw(
            {"message": f"[scripted tokens=200 itl_ms=50 tag={tag}] Tell me about volcanoes."},
            path=f"/api/chat/stream/{path}",
        ).events()
        events = [next(stream)]
        while len([e for e in events if e.event == "token"]) < 5:
            events.append(next(stream))
        old.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        try:
            events += list(stream)
        except ConnectionError:
            pass  # cut without the end of the body: the page reports a network error
        ended = time.monotonic()
        cookies = client.cookies()
    finally:
        client.close()
    old.process.wait(timeout=15)
    assert ended - stopped < 5
    assert "done" not in kinds(events)
    meta = events[0].json()
    evidence = f"engine events: {old.engine_events(tag)}\nworker log:\n{old.log()}"

    # Any other worker on the same database: the suite's shared one.
    with httpx.Client(base_url=daphne.url, cookies=cookies, timeout=10) as browser:
        response = browser.get(f"/api/conversations/{meta['conversation']}")
    assert response.status_code == 200, (response.text, evidence)
    messages = response.json()["messages"]
    assert [(m["id"], m["role"]) for m in messages] == [
        (meta["user_message"], "user"),
        (meta["message"], "assistant"),
    ], evidence
    answer = messages[1]
    assert answer["status"] == "partial"
    assert answer["content"].startswith(text_of(events))
    assert [e["event"] for e in old.engine_events(tag)] == ["start", "cancel"]
    assert StreamRecord.objects.filter(request_id=meta["request_id"]).exists()
