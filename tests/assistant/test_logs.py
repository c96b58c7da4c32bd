"""assistant/logs.py: log records as JSON lines, through a real logger and handler; and
CHATSITE_LOG_FORMAT as the settings read it, in a fresh process."""

import io
import json
import logging
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from assistant.logs import JsonFormatter, record_at
from tests.support import REDIS_URL, settings_run

ROOT = Path(__file__).resolve().parents[2]


class Written:
    """What a real StreamHandler with the JSON formatter wrote."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def objects(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]


@pytest.fixture
def log() -> Iterator[tuple[logging.Logger, Written]]:
    written = Written()
    handler = logging.StreamHandler(written.stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"tests.logs.{uuid.uuid4().hex[:8]}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, written
    logger.removeHandler(handler)


def test_a_record_is_one_object_with_exactly_its_fields(log) -> None:
    """time (UTC, milliseconds), level, logger, the formatted message, then each extra."""
    logger, written = log
    before = datetime.now(UTC)
    logger.info("answered %s in %d ms", "abc", 12, extra={"request_id": "abc", "tokens": 3})
    (line,) = written.objects()
    assert list(line) == ["time", "level", "logger", "message", "request_id", "tokens"]
    assert line["level"] == "INFO" and line["logger"] == logger.name
    assert line["message"] == "answered abc in 12 ms"
    assert (line["request_id"], line["tokens"]) == ("abc", 3)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    stamp = datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%f%z")
    # A generous sanity bound: the stamp is this moment's, in UTC.
    assert before - timedelta(seconds=1) <= stamp <= datetime.now(UTC) + timedelta(seconds=1)


def test_a_record_written_late_keeps_the_time_it_was_made_for(log) -> None:
    """``record_at``: the same line as ``logger.info(..., extra=...)``, timed when what it tells
    happened (an ended answer's line is written with others, after it); in the plain format
    too, and an extra naming a record's own attribute is refused as ``extra=`` refuses it."""
    logger, written = log
    at = datetime(2026, 3, 1, 8, 15, 2, 250_000, tzinfo=UTC).timestamp()
    logger.handle(record_at(logger, "stream ended", {"request_id": "abc", "tokens": 3}, at))
    logger.info("stream ended", extra={"request_id": "abc", "tokens": 3})
    late, now = written.objects()
    assert late["time"] == "2026-03-01T08:15:02.250Z" != now["time"]
    assert {**late, "time": None} == {**now, "time": None}
    plain = logging.Formatter("%(asctime)s %(message)s")
    plain.converter = time.gmtime
    record = record_at(logger, "stream ended", {}, at)
    assert plain.format(record) == "2026-03-01 08:15:02,250 stream ended"
    with pytest.raises(KeyError):
        record_at(logger, "stream ended", {"created": 1.0}, at)


def test_an_exception_keeps_its_traceback_as_one_string(log) -> None:
    """logger.exception: ``error`` is the exception's type and message, ``traceback`` the
    whole traceback, its newlines escaped so that the record stays one line."""
    logger, written = log

    def fail() -> None:
        raise KeyError("missing-thing")

    try:
        fail()
    except KeyError:
        logger.exception("Answer %s crashed", "abc")
    (raw,) = written.lines()
    line = json.loads(raw)
    assert line["level"] == "ERROR" and line["message"] == "Answer abc crashed"
    assert line["error"] == "KeyError: 'missing-thing'"
    traceback = line["traceback"]
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert "in fail" in traceback and __file__ in traceback
    assert traceback.rstrip().endswith("KeyError: 'missing-thing'")


def test_a_record_without_an_exception_has_no_traceback(log) -> None:
    """No ``error`` or ``traceback`` key, even for logger.exception outside an except block."""
    logger, written = log
    logger.error("plain failure")
    logger.exception("nothing being handled")
    assert all("traceback" not in o and "error" not in o for o in written.objects())


def test_values_json_cannot_hold_are_written_as_strings(log) -> None:
    """A UUID, a datetime, a set or an object is its str(); NaN and infinities become
    strings too: every line stays valid JSON."""
    logger, written = log
    ident = uuid.uuid4()
    when = datetime(2025, 1, 31, 8, 15, tzinfo=UTC)
    logger.info("odd values", extra={"id": ident, "when": when, "things": [1, ident]})
    logger.info("not numbers", extra={"nan": float("nan"), "inf": float("inf"), "ms": 1.5})
    odd, not_numbers = written.objects()
    assert odd["id"] == str(ident) and odd["when"] == str(when)
    assert odd["things"] == [1, str(ident)]
    assert (not_numbers["nan"], not_numbers["inf"], not_numbers["ms"]) == ("nan", "inf", 1.5)


def test_an_extra_never_replaces_the_fixed_fields(log) -> None:
    logger, written = log
    logger.warning("kept", extra={"time": "then", "level": "LOW", "logger": "someone"})
    (line,) = written.objects()
    assert (line["level"], line["logger"], line["message"]) == ("WARNING", logger.name, "kept")
    assert line["time"] != "then"


def test_each_record_is_one_line_whatever_it_holds(log) -> None:
    """Newlines in the message or the extras stay inside their strings; non-ASCII text is
    written as it is."""
    logger, written = log
    logger.info("two\nlines", extra={"question": "一\n二"})
    logger.info("second")
    first, second = written.lines()
    assert json.loads(first)["question"] == "一\n二" and "一" in first
    assert json.loads(second)["message"] == "second"


def settings_log_format(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Import chatsite.settings in a fresh process with ``env`` (plus PATH) and print the
    formatter its console handler uses."""
    script = "import chatsite.settings as s\nprint(s.LOGGING['handlers']['console']['formatter'])\n"
    return settings_run(script, env)


PRODUCTION = {
    "CHATSITE_PROFILE": "production",
    "CHATSITE_DEBUG": "0",
    "DJANGO_SECRET_KEY": "x" * 50,
    "DJANGO_ALLOWED_HOSTS": "chat.example.org",
    "DATABASE_URL": "postgres://chatsite:pw@127.0.0.1:5432/chatsite",
    "CHATSITE_REDIS_URL": REDIS_URL,
}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "plain"),
        ({"CHATSITE_LOG_FORMAT": "json"}, "json"),
        (PRODUCTION, "json"),
        ({**PRODUCTION, "CHATSITE_LOG_FORMAT": "plain"}, "plain"),
    ],
)
def test_log_format_is_plain_locally_and_json_in_production(
    env: dict[str, str], expected: str
) -> None:
    result = settings_log_format(env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_an_unknown_log_format_refuses_to_start() -> None:
    result = settings_log_format({"CHATSITE_LOG_FORMAT": "xml"})
    assert result.returncode != 0
    assert "CHATSITE_LOG_FORMAT must be 'plain' or 'json', not 'xml'" in result.stderr


def test_lean_records_write_the_same_lines_without_looking_up_their_caller(
    log, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``records_lean`` (a server's, once loaded): the same JSON line, field for field; the
    record no longer knows its caller, thread or process, which no line shows."""
    from assistant.logs import records_lean

    logger, written = log
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))  # restored after the test
    monkeypatch.setattr(logging, "logAsyncioTasks", logging.logAsyncioTasks)
    records: list[logging.LogRecord] = []

    class Kept(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            records.append(record)
            return True

    logger.addFilter(Kept())

    def say() -> None:
        logger.info("stream ended", extra={"request_id": "r1", "tokens": 40, "ttft": 1.5})

    say()
    records_lean()
    say()
    before, after = written.objects()
    assert before.keys() == after.keys()
    assert {k: v for k, v in before.items() if k != "time"} == {
        k: v for k, v in after.items() if k != "time"
    }
    assert (records[0].funcName, records[1].funcName) == ("say", "(unknown function)")
    assert records[0].threadName is not None and records[1].threadName is None
    assert records[1].process is None and records[1].lineno == 0
