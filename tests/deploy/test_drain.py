"""A rolling restart behind the real nginx: each worker drains on SIGTERM (chatsite/server.py;
chatsite/uvicorn_server.py for the same test with uvicorn workers), and 100 students being
answered meanwhile, plus more asking during the restart, all get their whole answer, stored
once.

Two workers behind deploy/nginx/chatsite.conf. 100 students ask at once (40 tokens 100 ms
apart: about 4 s each); a second later worker A gets SIGTERM, and once it has exited a new A
starts on its port; then the same for worker B. 20 more students ask while A drains.
"""

import json
import signal
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from assistant.models import Message, StreamRecord
from tests.support import Event, LiveServer, NginxServer, page_visit, raw_post, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

TOKENS = 40
QUESTION = f"[scripted tokens={TOKENS} ttft_ms=50 itl_ms=100] Explain it slowly"
Cookies = dict[str, str]


@pytest.fixture
def worker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("drain")


@pytest.fixture(params=["daphne", "uvicorn"])
def start(worker_dir: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., LiveServer]]:
    """Start a worker (on ``port`` again, for a restart) of the server the test runs with;
    every one is stopped at the end."""
    started: list[LiveServer] = []

    def run(port: int | None = None) -> LiveServer:
        server = start_daphne(
            workdir=worker_dir,
            db_path=connection.settings_dict["NAME"],
            env={"CHATSITE_DRAIN_S": "20"},
            port=port,
            uvicorn=request.param == "uvicorn",
        )
        started.append(server)
        return server

    yield run
    for server in started:
        server.stop()


def answer(port: int, cookies: Cookies, message: str) -> tuple[int, list[Event]]:
    """Ask through nginx and read the whole answer: its status and every event."""
    body = json.dumps({"message": message, "conversation": None}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-CSRFToken": cookies["csrftoken"],
        "X-Request-Id": uuid.uuid4().hex,
    }
    response = raw_post(port, body, cookies=cookies, headers=headers)
    events: list[Event] = []
    try:
        if response.status == 200:
            events.extend(response.events())
    except ConnectionError:
        pass  # cut: what arrived is returned, and the test names it
    finally:
        response.sock.close()
    return response.status, events


def drain(worker: LiveServer) -> float:
    """SIGTERM ``worker``: when it was signalled."""
    worker.process.send_signal(signal.SIGTERM)
    return time.monotonic()


def restart(
    worker: LiveServer, signalled: float, start: Callable[..., LiveServer]
) -> dict[str, Any]:
    """Wait for the drained ``worker`` to exit, then start a new one on its port."""
    code = worker.process.wait(timeout=60)
    exited = time.monotonic()
    start(port=worker.port)
    return {"exit": code, "drain_s": round(exited - signalled, 2), "log": worker.log()}


def whole(result: tuple[int, list[Event]]) -> bool:
    status, events = result
    tokens = [e for e in events if e.event == "token"]
    return status == 200 and len(tokens) == TOKENS and events[-1].event == "done"


def test_a_rolling_restart_cuts_no_answer(
    nginx_factory: Callable[..., NginxServer],
    start: Callable[..., LiveServer],
    output_dir: Path,
) -> None:
    workers = [start(), start()]
    site = nginx_factory("chatsite.conf", [w.port for w in workers])
    students = [page_visit(site.port).cookies for _ in range(120)]
    with ThreadPoolExecutor(max_workers=120) as pool:
        first = [pool.submit(answer, site.port, c, QUESTION) for c in students[:100]]
        time.sleep(1.0)  # every one of them is being answered now
        signalled = drain(workers[0])
        # Students asking while the first worker drains: nginx must send them to the other.
        second = [pool.submit(answer, site.port, c, QUESTION) for c in students[100:]]
        restarts = [restart(workers[0], signalled, start)]
        restarts.append(restart(workers[1], drain(workers[1]), start))
        results = [f.result(timeout=120) for f in first + second]

    broken = [
        (status, [e.event for e in events][-3:])
        for status, events in results
        if not whole((status, events))
    ]
    (output_dir / "drain.json").write_text(
        json.dumps(
            {
                "answers": len(results),
                "broken": len(broken),
                "broken_seen": broken[:5],
                "drain_s": [r["drain_s"] for r in restarts],
            },
            indent=2,
        )
        + "\n"
    )
    assert not broken, broken
    for done in restarts:
        assert done["exit"] == 0, done["log"][-2000:]
        assert "Drained: every open request has ended" in done["log"]
        assert done["drain_s"] < 20, done
    # The first worker waited for the answers it had open (about 4 s each, 1 s in).
    assert restarts[0]["drain_s"] > 1.0, restarts

    # Every answer stored once, whole, its record a success.
    message_ids = [
        next(e for e in events if e.event == "meta").json()["message"] for _, events in results
    ]

    def stored() -> int:
        return Message.objects.filter(id__in=message_ids, role="assistant").count()

    deadline = time.monotonic() + 30
    while stored() < len(message_ids) and time.monotonic() < deadline:
        time.sleep(0.2)
    answers = Message.objects.filter(id__in=message_ids, role="assistant")
    assert answers.count() == len(message_ids) == 120
    assert statistics.mean(len(a.content) for a in answers) > 0
    records = StreamRecord.objects.filter(message_id__in=message_ids)
    assert records.count() == 120
    assert set(records.values_list("outcome", flat=True)) == {"ok"}
