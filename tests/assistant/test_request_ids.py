"""A request id names one answer: reusing one (``X-Request-Id``) that an answer runs under is
refused with a clear 409 on both serving paths; reusing one a stored stream had gets its answer,
and its record is stored under a new id with one warning line naming both, never a traceback."""

import asyncio
import json
import logging
import re
import uuid
from typing import Any

import pytest

from assistant.models import Message, StreamRecord
from assistant.services.persistence import Rows, rows_store
from assistant.services.telemetry import refused_record
from assistant.services.timings import StreamTimings
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["direct", "django"])
def url(request: pytest.FixtureRequest) -> str:
    return f"/api/chat/stream/{request.param}"


def code_of(response) -> tuple[int, str]:
    return response.status, json.loads(response.body())["error"]["code"]


def test_an_id_of_a_stored_stream_is_replaced_in_the_new_record(
    daphne: LiveServer, url: str
) -> None:
    request_id = f"reused-{uuid.uuid4().hex[:12]}"
    owner, other = ChatClient(daphne), ChatClient(daphne)
    try:
        first = owner.raw({"message": "[scripted tokens=2] hi"}, {"X-Request-Id": request_id})
        assert first.status == 200 and list(first.events())[-1].event == "done"
        wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).exists())
        log_before = len(daphne.log())
        again = other.raw(
            {"message": "[scripted tokens=2] mine"}, {"X-Request-Id": request_id}, path=url
        )
        events = list(again.events())
    finally:
        owner.close()
        other.close()
    assert again.status == 200 and events[-1].event == "done"
    answer_id = events[0].json()["message"]
    record = wait_for(lambda: StreamRecord.objects.filter(message_id=answer_id).first())
    assert re.fullmatch(r"[0-9a-f]{32}", record.request_id)
    assert record.owner_key != StreamRecord.objects.get(request_id=request_id).owner_key
    assert wait_for(lambda: Message.objects.filter(id=answer_id).exists())
    log = wait_for(lambda: daphne.log()[log_before:] if record.request_id in daphne.log() else None)
    warning = [line for line in log.splitlines() if "used by an earlier stream" in line]
    assert len(warning) == 1 and request_id in warning[0] and record.request_id in warning[0]
    assert "Traceback" not in log and "IntegrityError" not in log


def test_an_id_of_a_running_stream_is_refused(daphne: LiveServer, url: str) -> None:
    request_id = f"running-{uuid.uuid4().hex[:12]}"
    owner, other = ChatClient(daphne), ChatClient(daphne)
    try:
        running = owner.raw(
            {"message": "[scripted tokens=40 itl_ms=50] long"}, {"X-Request-Id": request_id}
        )
        events = running.events()
        assert next(events).event == "meta"
        again = other.raw({"message": "me too"}, {"X-Request-Id": request_id}, path=url)
        rest = [event.event for event in events]
    finally:
        owner.close()
        other.close()
    refusal = json.loads(again.body())
    assert (again.status, refusal["error"]["code"]) == (409, "request_id_used")
    assert "already running under that request id" in refusal["error"]["message"]
    assert rest[-1] == "done"  # the running answer is not disturbed


def test_a_record_whose_id_is_taken_is_stored_under_a_new_one(caplog) -> None:
    request_id = f"stored-{uuid.uuid4().hex[:12]}"

    def record() -> dict[str, Any]:
        """A stream's record row (one with an answer message) under ``request_id``."""
        stored = refused_record(
            request_id=request_id,
            owner_key="session:test",
            classroom_id=None,
            serving_path="direct",
            engine="scripted",
            reason="engine_failed",
            timings=StreamTimings(received=0.0),
        )
        stored["message_id"] = uuid.uuid4()
        return stored

    asyncio.run(rows_store(Rows(records=[record()])))
    caplog.clear()
    second = record()
    with caplog.at_level(logging.WARNING, logger="assistant"):
        asyncio.run(rows_store(Rows(records=[second])))
    lines = [r for r in caplog.records if r.name.startswith("assistant")]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert lines[0].exc_info is None
    assert request_id in lines[0].getMessage() and second["request_id"] in lines[0].getMessage()
    stored = StreamRecord.objects.get(message_id=second["message_id"])
    assert stored.request_id == second["request_id"] != request_id


def test_a_request_refused_before_its_stream_may_be_sent_on_under_its_id(
    daphne_factory,
) -> None:
    """nginx sends a request the candidate refused (503) on to the baseline under the same id:
    the refusal takes no id, so the baseline streams it, and both are recorded."""
    server = daphne_factory(CHATSITE_DJANGO_ENGINE_ALIAS="not-configured")
    request_id = f"sent-on-{uuid.uuid4().hex[:12]}"
    client = ChatClient(server)
    try:
        headers = {"X-Request-Id": request_id}
        refused = client.raw({"message": "hi"}, headers, path="/api/chat/stream/django")
        assert (refused.status, json.loads(refused.body())["error"]["code"]) == (
            503,
            "engine_unavailable",
        )
        wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).exists())
        answered = client.raw(
            {"message": "[scripted tokens=2] hi"}, headers, path="/api/chat/stream/direct"
        )
        assert answered.status == 200 and list(answered.events())[-1].event == "done"
    finally:
        client.close()
    records = wait_for(
        lambda: (
            list(StreamRecord.objects.filter(request_id=request_id).order_by("created_at"))
            if StreamRecord.objects.filter(request_id=request_id).count() == 2
            else None
        )
    )
    assert [(r.path, r.outcome) for r in records] == [("django", "engine_error"), ("direct", "ok")]
