"""How a production worker stops, under both servers it runs on: Daphne (``python -m
chatsite.server``) and uvicorn (``python -m chatsite.uvicorn_server``), each a real process on
loopback sent real signals.

- The staff dashboard's live stream, which never ends on its own, ends at SIGTERM, so the drain
  does not wait ``CHATSITE_DRAIN_S`` for it.
- A worker stopped by SIGTERM exits 0 and marks its live Prometheus gauges dead (``atexit``),
  which uvicorn's own handling skips (it ends the process by raising the signal again).
- A second SIGTERM stops the worker at once, and the partial answer is still stored.
- With no drain (``CHATSITE_DRAIN_S=0``) a stop cuts what is open at once, under uvicorn too,
  stores it and writes its ``stream ended`` line; neither server logs a traceback for a
  request the stop cut.
- Under uvicorn, the listen backlog is ``CHATSITE_LISTEN_BACKLOG``.
"""

import re
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from assistant.models import Message
from tests.support import (
    ChatClient,
    Event,
    LiveServer,
    SSEReader,
    staff_cookies,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

#: A drain long enough that a test finishing well inside it shows the worker did not wait it out.
DRAIN_S = "20"
SERVERS = pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])


def stop(worker: LiveServer) -> tuple[int, str]:
    """SIGTERM ``worker`` and wait for it: its exit code and its log."""
    worker.process.send_signal(signal.SIGTERM)
    code = worker.process.wait(timeout=60)
    return code, worker.log()


@SERVERS
def test_a_stop_ends_the_dashboards_live_stream(worker_factory, server_kind: str) -> None:
    worker = worker_factory(CHATSITE_DRAIN_S=DRAIN_S)
    _user, cookies = staff_cookies(f"staff-stop-{server_kind}")
    reader = SSEReader()
    names: list[str] = []
    signalled = False
    with httpx.Client(base_url=worker.url, cookies=cookies, timeout=60) as client:
        with client.stream("GET", "/dashboard/events?window=5m") as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                names += [event.event for event in reader.feed(chunk)]
                if "snapshot" in names and not signalled:
                    worker.process.send_signal(signal.SIGTERM)
                    signalled = True
    # The stream ended (the loop above returned), and the drain found nothing open.
    code = worker.process.wait(timeout=60)
    log = worker.log()
    assert code == 0, log[-2000:]
    assert "Drained: every open request has ended" in log, log[-2000:]
    assert names.count("snapshot") >= 1


@SERVERS
def test_a_stopped_worker_marks_its_live_gauges_dead(
    worker_factory, server_kind: str, tmp_path
) -> None:
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    worker = worker_factory(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    client = ChatClient(worker)
    try:
        assert client.ask("[scripted tokens=2 ttft_ms=0]")[-1].event == "done"
    finally:
        client.close()
    pid = worker.process.pid
    live = sorted(p.name for p in metrics_dir.glob(f"gauge_live*_{pid}.db"))
    assert live, sorted(p.name for p in metrics_dir.iterdir())
    code, log = stop(worker)
    assert code == 0, log[-2000:]
    assert not list(metrics_dir.glob(f"gauge_live*_{pid}.db")), live
    assert list(metrics_dir.glob(f"counter_{pid}.db"))  # what it counted stays for the sum


@SERVERS
def test_a_second_sigterm_stops_at_once_and_the_answer_is_stored(
    worker_factory, server_kind: str
) -> None:
    worker = worker_factory(CHATSITE_DRAIN_S=DRAIN_S)
    client = ChatClient(worker)
    try:
        _stream, events = long_answer_begun(client)
        worker.process.send_signal(signal.SIGTERM)
        # Draining, the answer still streaming (20 s of it are left); two signals sent at once
        # could reach the handler as one.
        assert wait_for(lambda: "Draining:" in worker.log(), timeout=30)
        assert worker.process.poll() is None
        worker.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = worker.process.wait(timeout=60)
        waited = time.monotonic() - started
    finally:
        client.close()
    log = worker.log()
    assert code == 0, log[-2000:]
    assert "Asked again to stop: stopping now" in log, log[-2000:]
    # Far inside the 20 s drain: a sanity bound, not a measurement.
    assert waited < 15, log[-2000:]
    assert_stored_partial(events)
    assert "Traceback" not in log, log[-3000:]


@SERVERS
def test_with_no_drain_a_stop_cuts_at_once_stores_and_logs_no_traceback(
    worker_factory, server_kind: str
) -> None:
    """``CHATSITE_DRAIN_S=0``: the answer in flight is cut at the stop (uvicorn's own minimum
    of a second is not imposed), stored, and counted in one line, not a traceback each."""
    worker = worker_factory(CHATSITE_DRAIN_S="0")
    client = ChatClient(worker)
    try:
        _stream, events = long_answer_begun(client)
        code, log = stop(worker)
    finally:
        client.close()
    assert code == 0, log[-2000:]
    draining = r"Draining: accepting no more, 1 requests open on \d+ connections, up to 0 s"
    assert re.search(draining, log), log[-2000:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert_stored_partial(events)
    # Its metrics and its line, waiting for others to end with it, were made before the exit.
    assert log.count("assistant.streams: stream ended") == 1, log[-3000:]


def long_answer_begun(client: ChatClient) -> tuple[Iterator[Event], list[Event]]:
    """A 20 s answer's stream (the connection open as long as it is kept) and its first events,
    five of its tokens among them."""
    stream = client.raw({"message": "[scripted tokens=400 itl_ms=50] A long story"}).events()
    events = [next(stream)]
    while len([e for e in events if e.event == "token"]) < 5:
        events.append(next(stream))
    return stream, events


def assert_stored_partial(events: list[Event]) -> None:
    """The answer these events began is stored, cut short, with what it had said."""
    meta = events[0].json()
    answer = wait_for(lambda: Message.objects.filter(id=meta["message"]).first(), timeout=10)
    assert answer is not None and answer.status == "partial"
    assert answer.content


def test_under_uvicorn_the_listen_backlog_is_chatsites(uvicorn_factory) -> None:
    """uvicorn's own default is 2048, the same as chatsite's: a setting of 100 (below any
    kernel's cap, ``net.core.somaxconn``) shows the worker reads it (the Send-Q of a listening
    socket, in ``ss``)."""
    worker = uvicorn_factory(CHATSITE_LISTEN_BACKLOG="100")
    shown = subprocess.run(
        ["ss", "-Hltn", f"sport = :{worker.port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(shown[2]) == 100, shown
