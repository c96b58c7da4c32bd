"""What a teacher sees of their classes: per-class figures over a window of stream records, and
the class's recent questions (where its policy allows). The CSV export: ``class_export.py``.

Synchronous (ORM). The figures read only the columns they need over the (classroom_id,
created_at) index, in one query for every class shown; the live counts (answers streaming and
waiting for their first token, on any worker) come from ``services/class_live.py``.
"""

import hashlib
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from assistant.models import ClassMember, Classroom, Message, StreamRecord
from assistant.services.class_live import live_read
from assistant.services.dashboard import ttft_summary
from assistant.services.traffic_sums import REPORTED, PathWindow, client_ttft_ms

#: A student counts as active now when they asked in this many seconds, or have an answer
#: streaming.
ACTIVE_S = 300
_FIELDS = (
    "pk", "classroom_id", "owner_key", "created_at", "outcome", "server_ttft_ms",
    "client_ttft_ms", "client_waited_ms", "client_done_ms", "reported",
)  # fmt: skip


def student_pseudonym(owner_key: str) -> str:
    """A short name for a student without a nickname: stable, and no use as a credential."""
    return "student-" + hashlib.blake2b(owner_key.encode(), digest_size=4).hexdigest()


def class_figures(
    classroom_ids: Iterable[Any], *, window_s: int, now: datetime | None = None
) -> dict[str, dict[str, Any]]:
    """Per class (by id as text): students active now and waiting for a first token, answers
    streaming, questions asked, errors and abandoned answers in the window, and TTFT P50/P95
    as the server and the browser saw it (ms; None without data)."""
    wanted = [str(key) for key in classroom_ids]
    end = now or timezone.now()
    start = end - timedelta(seconds=max(window_s, ACTIVE_S))
    window_start = end - timedelta(seconds=window_s)
    active_start = end - timedelta(seconds=ACTIVE_S)
    windows = {key: PathWindow() for key in wanted}
    active: dict[str, set[str]] = {key: set() for key in wanted}
    rows = (
        StreamRecord.objects.filter(
            classroom_id__in=wanted, created_at__gte=start, created_at__lte=end
        )
        .order_by()
        .annotate(reported=REPORTED)
        .values_list(*_FIELDS)
    )
    for pk, classroom_id, owner, at, outcome, server, ttft, waited, done, was_reported in rows:
        if at >= active_start:
            active[str(classroom_id)].add(owner)
        if at >= window_start:
            client = (
                client_ttft_ms(ttft_ms=ttft, waited_ms=waited, done_ms=done)
                if was_reported
                else None
            )
            windows[str(classroom_id)].add(
                pk=pk,
                outcome=outcome,
                buffered=None,
                server=server,
                client=client,
            )
    live = live_read(wanted)
    figures = {}
    for key, window in windows.items():
        now_live = live[key]
        figures[key] = {
            "active": len(active[key] | set(now_live["students"])),
            "streaming": now_live["streaming"],
            "waiting": now_live["waiting"],
            "questions": window.requests,
            "errors": window.errors,
            "abandoned": window.abandoned,
            "server_ttft_ms": ttft_summary(sorted(window.server_ttft_ms)),
            "client_ttft_ms": ttft_summary(sorted(window.client_ttft_ms)),
        }
    return figures


def nicknames(classroom: Classroom, owner_keys: Iterable[str]) -> dict[str, str]:
    """The nickname each student gave when they (last) joined, where they gave one."""
    names: dict[str, str] = {}
    members = ClassMember.objects.filter(
        classroom=classroom, owner_key__in=set(owner_keys)
    ).order_by("joined_at")
    for owner_key, nickname in members.values_list("owner_key", "nickname"):
        if nickname:
            names[owner_key] = nickname
    return names


def class_questions(classroom: Classroom, *, limit: int = 50) -> list[dict[str, Any]]:
    """The class's latest questions with their answers, newest first: those asked while the
    class lets its teachers read them (``teachers_read_since``), none while it does not."""
    since = classroom.teachers_read_since  # None while they may not
    if since is None:
        return []
    # Asked since: when the request arrived (its record's time), as in the CSV.
    arrived = StreamRecord.objects.filter(classroom_id=classroom.id, created_at__gte=since)
    questions = list(
        Message.objects.filter(
            conversation__classroom=classroom,
            role=Message.Role.USER,
            replaced_at__isnull=True,
            request_id__in=arrived.values("request_id"),
            created_at__gte=since,  # a refused request may share a stored one's id
        )
        .order_by("-created_at")
        .values("request_id", "content", "created_at", "conversation__owner_key")[:limit]
    )
    answers = dict(
        Message.objects.filter(
            conversation__classroom=classroom,
            role=Message.Role.ASSISTANT,
            request_id__in=[q["request_id"] for q in questions],
        ).values_list("request_id", "content")
    )
    names = nicknames(classroom, (q["conversation__owner_key"] for q in questions))
    return [
        {
            "at": q["created_at"],
            "student": names.get(q["conversation__owner_key"])
            or student_pseudonym(q["conversation__owner_key"]),
            "question": q["content"],
            "answer": answers.get(q["request_id"], ""),
        }
        for q in questions
    ]
