"""What each class has in flight right now, across every worker process.

Answers live in the memory of the worker that runs them, and a teacher's dashboard may be served
by another. So each worker that is answering students of a class publishes its counts every
``PUBLISH_S`` seconds, off the path of any token, into one row of its own (``ClassLoad``); the
dashboard adds up the rows written in the last ``STALE_S`` seconds. A worker publishes only when
its counts change, and again every ``HEARTBEAT_S`` while they are not zero; a worker answering no
class writes nothing, and the loop ends once it has published that it is idle.
"""

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Protocol

from django.utils import timezone

from assistant.db import run_db_write
from assistant.models import ClassLoad
from assistant.services.answer_registry import answers_running
from assistant.services.identity import Identity
from assistant.services.timings import StreamTimings

logger = logging.getLogger(__name__)

PUBLISH_S = 2.0
HEARTBEAT_S = 5.0
#: Rows older than this are a worker that stopped (or crashed): not counted.
STALE_S = 10.0

Counts = dict[str, dict[str, Any]]


class ClassAnswer(Protocol):
    """What the counts need of a running answer (``services.answer.Answer``)."""

    identity: Identity
    timings: StreamTimings

    @property
    def finished(self) -> bool: ...


def live_counts(answers: Iterable[ClassAnswer]) -> Counts:
    """Per class (by id): answers streaming, those still waiting for their first token, and
    the students asking."""
    counts: Counts = {}
    for answer in answers:
        classroom = answer.identity.classroom
        if classroom is None or answer.finished:
            continue
        entry = counts.setdefault(str(classroom.id), {"streaming": 0, "waiting": 0, "students": []})
        entry["streaming"] += 1
        entry["waiting"] += not answer.timings.first_token_sent
        if answer.identity.owner_key not in entry["students"]:
            entry["students"].append(answer.identity.owner_key)
    for entry in counts.values():
        entry["students"].sort()
    return counts


#: This process's row: its host and pid, and a random part, so that two containers with the
#: same host name and pid never share a row.
WORKER = f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
#: Rows of workers gone longer than this are deleted by the next worker that publishes.
FORGET_S = 3600.0


def live_store(worker: str, counts: Counts) -> None:
    """Synchronous (ORM): this worker's counts, now; and the rows of long-gone workers go."""
    now = timezone.now()
    ClassLoad.objects.update_or_create(
        worker=worker, defaults={"updated_at": now, "classes": counts}
    )
    ClassLoad.objects.filter(updated_at__lt=now - timedelta(seconds=FORGET_S)).delete()


def live_read(classroom_ids: Iterable[str]) -> Counts:
    """Synchronous (ORM): each class's counts summed over the workers that published lately
    (zero for a class nobody is answering)."""
    wanted = {str(key) for key in classroom_ids}
    total: Counts = {key: {"streaming": 0, "waiting": 0, "students": []} for key in wanted}
    since = timezone.now() - timedelta(seconds=STALE_S)
    students: dict[str, set[str]] = {key: set() for key in wanted}
    for classes in ClassLoad.objects.filter(updated_at__gte=since).values_list(
        "classes", flat=True
    ):
        for key, entry in (classes or {}).items():
            if key not in wanted:
                continue
            total[key]["streaming"] += int(entry.get("streaming", 0))
            total[key]["waiting"] += int(entry.get("waiting", 0))
            students[key].update(entry.get("students", ()))
    for key, seen in students.items():
        total[key]["students"] = sorted(seen)
    return total


class _Publisher:
    task: asyncio.Task[None] | None = None


_publisher = _Publisher()


def class_live_start() -> None:
    """Publish this worker's counts while it answers classes (idempotent; on the event loop)."""
    task = _publisher.task
    loop = asyncio.get_running_loop()
    if task is not None and not task.done() and task.get_loop() is loop:
        return
    _publisher.task = loop.create_task(_publish_loop(), name="chatsite-class-live")


async def _publish_loop() -> None:
    loop = asyncio.get_running_loop()
    published: Counts | None = None
    published_at = 0.0
    failing = False
    while True:
        await asyncio.sleep(PUBLISH_S)
        counts = live_counts(answers_running())  # type: ignore[arg-type]
        due = counts and loop.time() - published_at >= HEARTBEAT_S
        if counts != published or due:
            try:
                await run_db_write(live_store, WORKER, counts)
                published, published_at, failing = counts, loop.time(), False
            except asyncio.CancelledError:
                raise
            except Exception:
                # Once per outage (the database is down: everything else says so too); the
                # teachers' figures miss this worker's live counts meanwhile.
                if not failing:
                    logger.exception("Could not publish the classes' live counts")
                failing = True
        # Idle, and said so: end, unless a class answer started during that write (it found
        # this loop running, so it started none). No await between this check and the end.
        if not counts and published == {} and not live_counts(answers_running()):  # type: ignore[arg-type]
            return  # the next class answer starts the loop again
