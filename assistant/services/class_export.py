"""A class's stream records as CSV, for its teachers: when, who (nickname, else a pseudonym),
timings and outcome; the question and answer only where the class lets its teachers read them.

Synchronous (ORM), a page at a time (``class_csv_page``, keyset-paginated over the records'
(created_at, pk)), so the view streams a whole term of records without holding it in memory
and each page is one short trip to a database thread.
"""

import csv
import io
from datetime import datetime

from django.db.models import Q

from assistant.models import Classroom, Message, StreamRecord
from assistant.services.class_figures import nicknames, student_pseudonym
from assistant.services.traffic_sums import client_ttft_ms

CSV_COLUMNS = (
    "time", "student", "request_id", "serving_path", "engine", "outcome", "error_code",
    "tokens", "server_ttft_ms", "browser_ttft_ms", "inter_token_mean_ms", "total_ms",
)  # fmt: skip
CSV_TEXT_COLUMNS = ("question", "answer")
PAGE_RECORDS = 1000

#: Where a page ended: the last record's (created_at, pk); None: the first page.
After = tuple[datetime, int] | None


def csv_cell(value: object) -> str:
    """A cell as text, never a formula: a spreadsheet runs text starting with = + - @ (or a
    tab or carriage return) as one, so such text gets a leading apostrophe."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _lines(rows: list[list[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerows([csv_cell(cell) for cell in row] for row in rows)
    return buffer.getvalue()


def class_csv_header(classroom: Classroom) -> str:
    """The header line: the text columns only when the class lets its teachers read."""
    with_text = classroom.teachers_read_since is not None  # None while they may not read
    columns = CSV_COLUMNS + (CSV_TEXT_COLUMNS if with_text else ())
    return _lines([list(columns)])


def class_csv_page(
    classroom: Classroom, *, after: After, names: dict[str, str], size: int = PAGE_RECORDS
) -> tuple[str, After]:
    """Up to ``size`` records after ``after``, oldest first, as CSV lines, and where the next
    page starts (None: this was the last). ``names`` caches the students' names between pages.
    Questions asked before the teachers could read them (their students were told so) have
    their text left out."""
    records = StreamRecord.objects.filter(classroom_id=classroom.id).order_by("created_at", "pk")
    if after is not None:
        at, pk = after
        records = records.filter(Q(created_at__gt=at) | Q(created_at=at, pk__gt=pk))
    batch = list(records[:size])
    unknown = {r.owner_key for r in batch} - names.keys()
    if unknown:
        found = nicknames(classroom, unknown)
        names.update({key: found.get(key) or student_pseudonym(key) for key in unknown})
    since = classroom.teachers_read_since  # None while the teachers may not read
    texts: dict[tuple[str, str], str] = {}
    if since is not None:
        rows = Message.objects.filter(
            conversation__classroom=classroom,
            request_id__in=[r.request_id for r in batch if r.created_at >= since],
            created_at__gte=since,  # a refused request may share a stored one's id
        ).values_list("request_id", "role", "content")
        texts = {(request_id, role): content for request_id, role, content in rows}
    lines: list[list[object]] = []
    for r in batch:
        cells: list[object] = [
            r.created_at.isoformat(), names[r.owner_key], r.request_id, r.path, r.engine,
            r.outcome, r.error_code, r.tokens, r.server_ttft_ms,
            client_ttft_ms(
                ttft_ms=r.client_ttft_ms, waited_ms=r.client_waited_ms, done_ms=r.client_done_ms
            ) if r.client_reported_at else None,
            r.itl_mean_ms, r.e2e_ms,
        ]  # fmt: skip
        if since is not None:
            question = texts.get((r.request_id, Message.Role.USER), "")
            cells += [question, texts.get((r.request_id, Message.Role.ASSISTANT), "")]
        lines.append(cells)
    last = (batch[-1].created_at, batch[-1].pk) if len(batch) == size else None
    return _lines(lines), last
