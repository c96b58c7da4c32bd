"""Log records as JSON lines, for machines (``CHATSITE_LOG_FORMAT=json``).

One record is one line: one JSON object with ``time`` (ISO 8601, UTC, milliseconds), ``level``,
``logger`` and ``message``, then every field the call passed with ``extra=``, then, for a record
with an exception, ``error`` (its type and message) and ``traceback`` (the whole formatted
traceback, newlines escaped, so it stays on its line). A collector (journald, Loki, Vector...)
or ``jq`` reads each line on its own; docs/monitoring.md shows the ``stream ended`` line that
every answer writes, and how to join it with nginx's access log.

Hand-written with the standard library: a log line is formatted on the event loop, so it does
little more than one ``json.dumps``; and the project adds no dependency without a re-lock.
"""

import json
import logging
import math
import time
from typing import Any

#: Attributes every LogRecord has (and two the formatting adds): anything else came in ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
}
#: JSON's own scalars but floats: written as they are when a line falls back to strings.
_SCALARS = (str, int, bool, type(None))
#: Compact: a line per record, no spaces nobody reads.
_SEPARATORS = (",", ":")


def records_lean() -> None:
    """Make log records without what no line of chatsite's shows: the caller's file, line and
    function (a walk up the stack for every record), the thread's, process's and asyncio task's
    names. These are the logging module's own switches for it (the Logging HOWTO's
    "Optimization"). Neither format writes them (``plain`` is the time, level, logger and
    message; ``json`` leaves every standard attribute out), and a traceback is formatted from
    its exception, not from them. A worker writes a line for every answer: 21 µs a JSON line
    before, 18.5 after (docs/performance.md). Called once a server has loaded (chatsite/asgi.py);
    a custom format naming ``%(funcName)s``, ``%(threadName)s`` and the like would show
    placeholders."""
    logging._srcfile = None  # type: ignore[attr-defined]  # documented: no caller lookup
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.logAsyncioTasks = False


def record_at(
    logger: logging.Logger, message: str, fields: dict[str, Any], at: float
) -> logging.LogRecord:
    """An INFO record of ``logger``'s with ``fields`` as its extras, made now but timed ``at``
    (``time.time()`` when what it tells happened): a line written late keeps its own time.
    Passed to ``logger.handle``; a field named as a record's own attribute is refused, as
    ``extra=`` refuses it."""
    record = logger.makeRecord(
        logger.name, logging.INFO, "(unknown file)", 0, message, (), None, extra=fields
    )
    record.created = at
    # As LogRecord times itself (Python 3.12).
    record.msecs = int((at - int(at)) * 1000) + 0.0
    record.relativeCreated = (at - logging._startTime) * 1000  # type: ignore[attr-defined]
    return record


def _plain(value: object) -> object:
    """``value`` if JSON holds it as it is, else its ``str()`` (NaN and infinities too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return value if isinstance(value, _SCALARS) else str(value)


def _utc(created: float, msecs: float) -> str:
    """``created`` as ``2025-01-31T08:15:02.047Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """Each record as one line of JSON (see the module docstring).

    An extra never replaces ``time``, ``level``, ``logger`` or ``message``; a value JSON cannot
    hold (a UUID, a datetime, an object) is written as its ``str()``; NaN, infinities or a
    cycle turn the line's lists, dicts and those floats into strings rather than fail it."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in line:
                line[key] = value
        exc_info = record.exc_info
        if exc_info and exc_info[0] is not None:
            if not record.exc_text:  # cached on the record, as logging.Formatter does
                record.exc_text = self.formatException(exc_info)
            line["error"] = f"{exc_info[0].__name__}: {exc_info[1]}"
            line["traceback"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(
                line, default=str, ensure_ascii=False, allow_nan=False, separators=_SEPARATORS
            )
        except (TypeError, ValueError):  # NaN, a cycle, a key JSON cannot have
            safe = {key: _plain(value) for key, value in line.items()}
            return json.dumps(safe, ensure_ascii=False, separators=_SEPARATORS)
