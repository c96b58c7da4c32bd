"""The embedded model in its own supervised process (assistant/modelhost, engines/model_process).

Real processes throughout: the supervisor and its model process started as ``./scripts/run`` and
systemd start them, real Daphne workers, real signals. Where a test is about the process
boundary rather than the model, the model process hosts the scripted engine (fast and exact);
the crash tests run the real SmolLM2 model. Time bounds are generous sanity checks; the figures
(the hop's cost, the time to restart, to cancel) come from benchmarks/model_process.py.
"""

import asyncio
import json
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from assistant.engines import ChatMessage, EngineError, EngineUnavailable, GenerationParams
from assistant.engines.model_process import ModelProcessEngine
from assistant.modelhost import protocol
from assistant.modelhost.protocol import Failure
from tests.assistant.faults_support import assert_partial_answer_kept, kinds, metric
from tests.support import ChatClient, ModelHost, short_socket_path, wait_for

SCRIPTED = "assistant.engines.scripted.ScriptedEngine"
QUESTION = [ChatMessage("user", "光合作用是什么? What is photosynthesis?")]
LONG_QUESTION = "Write a very long story about a dragon who learns to read."


@pytest.fixture
def scripted_host(tmp_path: Path) -> Iterator[ModelHost]:
    events = tmp_path / "engine-events.jsonl"
    host = ModelHost(
        tmp_path / "modelhost.log",
        backend=SCRIPTED,
        options={"TTFT_MS": 20, "ITL_MS": 20, "TOKENS": 10, "EVENTS_FILE": str(events)},
    )
    host.events = events  # type: ignore[attr-defined]
    yield host
    host.stop()


def engine_events(host: ModelHost) -> list[dict]:
    path: Path = host.events  # type: ignore[attr-defined]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def collect(engine: ModelProcessEngine, question: list[ChatMessage]) -> list:
    return [delta async for delta in engine.stream(question, GenerationParams(max_tokens=64))]


# --- the process boundary, with the scripted engine ---------------------------------------------


async def test_an_answer_streams_through_the_model_process(scripted_host: ModelHost) -> None:
    """Tokens come in order, the last with its finish reason; the host reports itself up."""
    engine = ModelProcessEngine("t", {"SOCKET": str(scripted_host.socket)})
    deltas = await collect(engine, QUESTION)
    texts = [d.text for d in deltas if d.text]
    assert len(texts) == 10 and texts[0] == "Photosynthesis"
    assert deltas[-1].finish_reason == "stop"
    status = engine.status
    assert status is not None and status.state == "up" and status.restarts == 0
    assert engine_events(scripted_host)[0]["params"]["max_tokens"] == 64


def test_a_bad_request_gets_a_clear_failure_and_the_host_keeps_serving(
    scripted_host: ModelHost,
) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(scripted_host.socket))
        sock.sendall(b'{"op": "generate", "messages": 1}\n')
        reply = protocol.reply_parse(sock.makefile("rb").readline())
    assert isinstance(reply, Failure) and reply.code == "bad_request"
    assert scripted_host.status().state == "up"


async def test_closing_the_connection_cancels_the_answer_in_the_model_process(
    scripted_host: ModelHost,
) -> None:
    """A worker that stops reading after two tokens: the engine in the model process is
    cancelled (well within a second here; benchmarks/model_process.py measures it)."""
    engine = ModelProcessEngine("t", {"SOCKET": str(scripted_host.socket)})
    stream = engine.stream(QUESTION, GenerationParams(max_tokens=64))
    got = [await anext(stream), await anext(stream)]
    closed = time.monotonic()
    await stream.aclose()
    assert [d.text for d in got] == ["Photosynthesis", " turns"]
    cancel = None
    while cancel is None and time.monotonic() - closed < 5:
        await asyncio.sleep(0.01)  # the loop closes the socket on its next turn
        cancel = next((e for e in engine_events(scripted_host) if e["event"] == "cancel"), None)
    assert cancel is not None, engine_events(scripted_host)
    assert cancel["tokens"] == 2
    assert cancel["t"] - closed < 1.0


async def test_a_crash_mid_answer_is_engine_crashed_and_the_next_answer_comes(
    scripted_host: ModelHost,
) -> None:
    """SIGKILL to the model process mid-answer: the stream fails with engine_crashed; the
    supervisor starts a new one, says how the last one ended, and it answers."""
    engine = ModelProcessEngine("t", {"SOCKET": str(scripted_host.socket)})
    stream = engine.stream(QUESTION, GenerationParams(max_tokens=64))
    await anext(stream)
    pid = scripted_host.kill_runner(signal.SIGKILL)
    with pytest.raises(EngineError) as failed:
        async with asyncio.timeout(5):
            async for _ in stream:
                pass
    assert failed.value.code == "engine_crashed"
    assert not isinstance(failed.value, EngineUnavailable)

    status = scripted_host.wait_until(lambda s: s.state == "up" and s.restarts == 1)
    assert status.pid != pid and status.last_exit == "SIGKILL"
    deltas = await collect(engine, QUESTION)
    assert deltas[-1].finish_reason == "stop"


async def test_a_refusing_worker_notices_the_model_process_is_back(tmp_path: Path) -> None:
    """Known to be down, the engine refuses from what it last heard, without waiting on the
    socket, and a thread asks again: soon after the model process starts, questions pass."""
    path = short_socket_path()
    engine = ModelProcessEngine("t", {"SOCKET": str(path)})
    with pytest.raises(EngineUnavailable):
        engine.load()
    host = ModelHost(tmp_path / "modelhost.log", backend=SCRIPTED, socket=path)
    try:
        refused = 0
        while True:
            try:
                engine.check()
                break
            except EngineUnavailable as exc:
                assert exc.code == "model_process_down"
                refused += 1
                assert refused < 100, "still refused 5 s after the model process started"
                await asyncio.sleep(0.05)
        deltas = await collect(engine, [ChatMessage("user", "[scripted tokens=3]")])
        assert [d.text for d in deltas if d.text] == ["Photosynthesis", " turns", " light,"]
    finally:
        host.stop()
        shutil.rmtree(path.parent)


def test_no_model_process_means_a_clear_unavailable(tmp_path: Path) -> None:
    engine = ModelProcessEngine("t", {"SOCKET": str(tmp_path / "nothing.sock")})
    with pytest.raises(EngineUnavailable) as refused:
        engine.load()
    assert refused.value.code == "model_process_down"
    assert "python -m assistant.modelhost" in str(refused.value)
    with pytest.raises(EngineUnavailable):
        engine.check()


async def test_a_model_that_cannot_load_is_reported_and_retried_with_backoff(
    tmp_path: Path,
) -> None:
    """A missing model file: requests get the engine's own reason (no_model) at once, before
    any response starts, and the supervisor retries with growing delays, not in a hot loop."""
    host = ModelHost(
        tmp_path / "modelhost.log",
        env={"CHATSITE_LLAMACPP_MODEL_PATH": str(tmp_path / "none.gguf")},
    )
    try:
        status = host.status()
        assert (status.state, status.code) == ("down", "no_model"), status
        engine = ModelProcessEngine("t", {"SOCKET": str(host.socket)})
        with pytest.raises(EngineUnavailable) as refused:
            engine.check() if engine.status else engine.load()
        assert refused.value.code == "no_model"
        with pytest.raises(EngineUnavailable) as in_stream:
            await collect(engine, QUESTION)
        assert in_stream.value.code == "no_model"
        await asyncio.sleep(2)
        # Without a delay it would have tried about ten times by now.
        assert host.status().restarts <= 6
    finally:
        host.stop()
    assert "no_model" in host.log.read_text() or "not found" in host.log.read_text()


@pytest.mark.django_db(transaction=True)
def test_a_worker_without_its_model_process_still_serves_pages(daphne_factory, tmp_path) -> None:
    """No model process at all: pages and /healthz are served, a question gets a clear 503."""
    server = daphne_factory(
        CHATSITE_ENGINE="llamacpp", CHATSITE_MODEL_SOCKET=str(tmp_path / "none.sock")
    )
    client = ChatClient(server)
    try:
        assert client.client.get("/").status_code == 200
        response = client.raw({"message": "hello"})
        assert response.status == 503
        assert json.loads(response.body())["error"]["code"] == "engine_unavailable"
    finally:
        client.close()
        server.stop()


@pytest.mark.model
async def test_a_model_that_appears_later_is_loaded_and_answers(tmp_path: Path) -> None:
    """The model file is missing at first, then put in place: the supervisor's retries load
    it while it keeps answering "no_model" meanwhile (many status questions at once, racing
    the model process for the shared socket), and the next question is answered."""
    from assistant.engines.llamacpp import default_model_path

    model = tmp_path / "later.gguf"
    host = ModelHost(tmp_path / "modelhost.log", env={"CHATSITE_LLAMACPP_MODEL_PATH": str(model)})
    try:
        assert host.status().code == "no_model"
        model.symlink_to(default_model_path())
        with ThreadPoolExecutor(4) as pool:
            seen: set[str] = set()
            deadline = time.monotonic() + 30
            while "up" not in seen and time.monotonic() < deadline:
                seen |= {s.state for s in pool.map(lambda _: host.status(), range(8))}
        assert "up" in seen, host.log.read_text()
        assert host.process.poll() is None
        engine = ModelProcessEngine("t", {"SOCKET": str(host.socket)})
        deltas = [d async for d in engine.stream(QUESTION, GenerationParams(max_tokens=8))]
        assert deltas[-1].finish_reason in {"stop", "length"}
        assert "".join(d.text for d in deltas).strip()
    finally:
        host.stop()


# --- the real model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelHost]:
    """One real model process for the module, its metrics in the workers' directory."""
    work = tmp_path_factory.mktemp("model")
    metrics = work / "metrics"
    metrics.mkdir()
    host = ModelHost(work / "modelhost.log", env={"PROMETHEUS_MULTIPROC_DIR": str(metrics)})
    host.metrics_dir = metrics  # type: ignore[attr-defined]
    yield host
    host.stop()


@pytest.fixture(scope="module")
def workers(daphne_factory, shared_model: ModelHost) -> list:
    """Two Daphne workers on the one model process, as two systemd instances on one host."""
    env = {
        "CHATSITE_ENGINE": "llamacpp",
        "CHATSITE_MODEL_SOCKET": str(shared_model.socket),
        "CHATSITE_MAX_TOKENS": "200",
        "CHATSITE_TEMPERATURE": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(shared_model.metrics_dir),  # type: ignore[attr-defined]
    }
    return [daphne_factory(**env), daphne_factory(**env)]


@pytest.mark.model
@pytest.mark.django_db(transaction=True)
def test_two_workers_share_one_line_for_the_model(workers: list) -> None:
    """A student on the second worker waits behind one on the first, and is told so."""
    first, second = ChatClient(workers[0]), ChatClient(workers[1])
    try:
        stream = first.raw({"message": LONG_QUESTION}).events()
        while next(stream).event != "token":
            pass
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(second.ask, "What is 2+2?")
            rest = list(stream)
            behind = waiting.result(timeout=120)
    finally:
        first.close()
        second.close()
    assert kinds(rest)[-1] == "done"
    assert kinds(behind)[0] == "meta" and kinds(behind)[-1] == "done", kinds(behind)
    first_token = kinds(behind).index("token")
    assert "queue" in kinds(behind)[:first_token], kinds(behind)


@pytest.mark.model
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_the_model_process_dying_mid_answer_never_takes_a_worker_down(
    workers: list, shared_model: ModelHost, sig: signal.Signals
) -> None:
    """The model process killed while one student is answered and another waits: both get
    event: error engine_crashed within a second, the partial answer is kept, the worker keeps
    serving pages, the model process comes back, the next question is answered, and /metrics
    and the dashboard's status count the restart."""
    before = shared_model.status()
    asking, waiting = ChatClient(workers[0]), ChatClient(workers[1])
    try:
        stream = asking.raw({"message": LONG_QUESTION}).events()
        events = [next(stream)]
        while kinds(events).count("token") < 3:
            events.append(next(stream))
        with ThreadPoolExecutor(1) as pool:
            behind = pool.submit(lambda: list(waiting.raw({"message": "What is a cell?"}).events()))
            wait_for(lambda: shared_model.status().active == 2, timeout=10)
            shared_model.kill_runner(sig)
            killed = time.monotonic()
            events += list(stream)
            ended = time.monotonic()
            behind_events = behind.result(timeout=10)
        page = asking.client.get("/")
    finally:
        asking.close()
        waiting.close()

    assert kinds(events)[-1] == "error", kinds(events)
    assert events[-1].json()["code"] == "engine_crashed"
    assert ended - killed < 1.0
    assert kinds(behind_events)[-1] == "error", kinds(behind_events)
    assert behind_events[-1].json()["code"] == "engine_crashed"
    assert page.status_code == 200
    for worker in workers:
        assert worker.process.poll() is None

    assert_partial_answer_kept(events, "engine_crashed")

    status = shared_model.wait_until(
        lambda s: s.state == "up" and s.restarts == before.restarts + 1, timeout=60
    )
    assert status.last_exit == sig.name
    nxt = ChatClient(workers[1])
    try:
        answered = nxt.ask("What is 2+2?")
    finally:
        nxt.close()
    assert kinds(answered)[-1] == "done", kinds(answered)

    restarts = "ai_model_process_restarts_total"
    assert metric(workers[0], restarts, reason=sig.name) == 1
    assert metric(workers[1], restarts) == before.restarts + 1
    described = ModelProcessEngine("t", {"SOCKET": str(shared_model.socket)}).describe()
    assert described is not None
    assert (described["state"], described["restarts"]) == ("up", before.restarts + 1)
    assert described["last_exit"] == sig.name
    assert httpx.get(f"{workers[0].url}/healthz", timeout=5).status_code == 200
