"""Group commit: rows from many streams are written together, by one writer, off the hot path.

Every stream stores a question (and maybe a conversation) after its first token and an answer
when it ends. Written one by one, those small transactions cost more CPU than everything else a
stream does, and under load that CPU is taken from other streams' first tokens. Here each event
loop has one flusher: whatever was submitted while the previous batch was being written goes
into the next one, as one transaction: on PostgreSQL one statement and one round trip
(``batch_statement``), on SQLite one INSERT per table. Alone, a row is written at once; under
load, batches grow and the cost per row falls. Submission order is write order, so a question
is always stored before its answer.

A batch costs the writer far more than a row in it (``benchmarks/answer_end.py``), and a batch
taken the moment the previous one is stored holds only what arrived meanwhile. So with many
answers running (``PERSIST_BATCH_FROM``), the writer takes a batch at most once every
``PERSIST_BATCH_MS``: what was said is stored that much later, never more, and many answers share
each transaction. With fewer running, or the first time after a pause, rows are written at once.
The rows of a conversation still on their way are known: a follow-up question's history is
completed with the messages among them (``rows_held``, ``conversations.history_completed``), or,
where they make the conversation or set questions aside, waits for them (``rows_writing``,
``rows_written``, ``conversations.conversation_written``).
"""

import asyncio
import logging
import math
import uuid
import weakref
from dataclasses import dataclass, field

from django.conf import settings
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.utils import timezone

from assistant import metrics
from assistant.db import run_db_write
from assistant.ids import ordered_uuid
from assistant.models import Message
from assistant.services.answer_registry import answers_running_count
from assistant.services.background import failure_taken
from assistant.services.batch_statement import Tables, batch_statement, batch_statement_run
from assistant.services.deleted_marks import deleted_dropped
from assistant.services.table_rows import Row
from assistant.services.table_writes import classes_gone, messages_replace, tables_write
from assistant.services.traffic_sums import spans_invalidate

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Rows:
    """What one caller wants stored, atomically with respect to itself: rows of
    ``Conversation``, ``Message`` and ``StreamRecord`` (``table_rows``)."""

    conversations: list[Row] = field(default_factory=list)
    messages: list[Row] = field(default_factory=list)
    #: Conversations whose ``updated_at`` moves to now (they got a new answer).
    touch: list[uuid.UUID] = field(default_factory=list)
    #: (conversation, question, its replacement): that question and every message after it,
    #: but its replacement, are set aside (``Message.replaced_at``) once the batch is stored.
    replaced: list[tuple[uuid.UUID, uuid.UUID, uuid.UUID]] = field(default_factory=list)
    records: list[Row] = field(default_factory=list)
    #: The records' request ids were replaced once already (``records_renamed``).
    renamed: bool = False
    #: The conversation these rows belong to, when they are to be left out had it been deleted
    #: meanwhile (``deleted_dropped``); ``dropped`` says they were.
    unless_deleted: uuid.UUID | None = None
    dropped: bool = False


def records_renamed(rows: Rows) -> bool:
    """Give ``rows``' stream records new request ids, once, when an earlier stream's record has
    theirs (a client sent an id again): one warning line each, naming both ids. False when
    ``rows`` are not records alone, or were renamed already."""
    if rows.renamed or not rows.records or rows.messages or rows.conversations:
        return False
    rows.renamed = True
    for record in rows.records:
        new_id = ordered_uuid().hex
        logger.warning(
            "Request id %s was used by an earlier stream: this stream's record is stored as %s",
            record["request_id"],
            new_id,
        )
        record["request_id"] = new_id
    return True


def rows_write(batch: list[Rows]) -> None:
    """Synchronous (ORM): store ``batch`` in one transaction. On PostgreSQL that is one
    statement, run in one round trip (``batch_statement``); on SQLite, one statement per
    table."""
    tables = Tables(
        conversations=[c for rows in batch for c in rows.conversations],
        messages=[m for rows in batch for m in rows.messages],
        touch={cid for rows in batch for cid in rows.touch},
        records=[r for rows in batch for r in rows.records],
    )
    replaced = [row for rows in batch for row in rows.replaced]
    connection = connections[router.db_for_write(Message)]
    statement = batch_statement(tables, connection) if connection.vendor == "postgresql" else None
    if statement is None:
        classes_gone(tables.conversations)  # the statement checks them itself
    if statement is not None and not replaced and not connection.in_atomic_block:
        batch_statement_run(statement, connection)  # a transaction of its own
    else:
        # In a transaction already (a savepoint then: a refusal must not end the caller's), or
        # with questions to set aside after the inserts, or on SQLite.
        with transaction.atomic():
            if statement is not None:
                batch_statement_run(statement, connection)
            else:
                tables_write(tables)
            for conversation_id, first, keep in replaced:
                messages_replace(conversation_id=conversation_id, first=first, keep=keep)
    if tables.records:
        spans_invalidate((r["created_at"] for r in tables.records), now=timezone.now())


class GroupWriter:
    """One event loop's writer: ``writer.submit(rows)`` hands ``rows`` over and returns the
    future that is done once they are stored."""

    def __init__(self) -> None:
        self._queue: list[tuple[Rows, asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: When the last batch was taken (the loop's clock): the next waits for ``_pause``.
        self._taken_at = -math.inf
        #: Each conversation's rows handed over and not written yet (nor given up), in order.
        self._writing: dict[uuid.UUID, list[Rows]] = {}
        #: Done when the batch being written is, for ``written``'s waiters (None: none waits).
        self._flushed: asyncio.Future[None] | None = None

    def submit(self, rows: Rows) -> asyncio.Future[None]:
        """Queue ``rows`` for the next batch: the future is done once they are stored, or has
        their failure. Cancelling it stores them all the same."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((rows, done))
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        for conversation_id in _conversations_of(rows):
            self._writing.setdefault(conversation_id, []).append(rows)
        return done

    def writing(self, conversation_id: uuid.UUID) -> bool:
        """Whether rows of ``conversation_id`` handed over are not written yet."""
        return conversation_id in self._writing

    def held(self, conversation_id: uuid.UUID) -> list[Row] | None:
        """The messages of ``conversation_id`` handed over and not known to be written yet, in
        the order handed over (some may be written by the time they are read): what a history
        read of it lacks. None when the rows held are more than messages added to it (they make
        the conversation, or set questions aside): a read must wait for them (``written``)."""
        messages: list[Row] = []
        for rows in self._writing.get(conversation_id, ()):
            if rows.conversations or rows.replaced:
                return None
            messages += (m for m in rows.messages if m["conversation_id"] == conversation_id)
        return messages

    async def written(self, conversation_id: uuid.UUID) -> None:
        """Return once every row of ``conversation_id`` handed over so far is written (or given
        up, and logged). Cancelling the wait leaves the writing as it is."""
        while conversation_id in self._writing:
            if self._flushed is None:
                self._flushed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._flushed)

    def _batch_done(self, batch: list[tuple[Rows, asyncio.Future[None]]]) -> None:
        writing = self._writing
        for rows, _ in batch:
            for conversation_id in _conversations_of(rows):
                held = [other for other in writing.get(conversation_id, ()) if other is not rows]
                if held:
                    writing[conversation_id] = held
                else:
                    writing.pop(conversation_id, None)
        flushed, self._flushed = self._flushed, None
        if flushed is not None:
            flushed.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            pause = _pause(self._taken_at, loop.time())
            if pause > 0:
                await asyncio.sleep(pause)  # more answers' rows join this batch meanwhile
            self._wakeup.clear()
            batch, self._queue = self._queue, []
            if batch:
                self._taken_at = loop.time()
                await self._flush(batch)
                self._batch_done(batch)

    async def _flush(self, batch: list[tuple[Rows, asyncio.Future[None]]]) -> None:
        try:
            await _write_retrying([rows for rows, _ in batch])
        except (OperationalError, InterfaceError):
            # Unreachable for the whole retry budget: every row in the batch is lost alike
            # (retrying them one by one would hold the writer for the budget again each).
            for rows, done in batch:
                if not done.done():
                    done.set_exception(_failure(rows))
                logger.error("Could not store %s: the database stayed unreachable", _describe(rows))
                metrics.PERSISTENCE_FAILURES.labels("lost").inc()
            return
        except Exception as exc:
            if isinstance(exc, IntegrityError) and await deleted_dropped([r for r, _ in batch]):
                await self._flush(batch)  # again, without the deleted conversations' rows
                return
            if len(batch) > 1:
                # One bad row must not lose the others: retry them one by one.
                for item in batch:
                    await self._flush([item])
                return
            rows, done = batch[0]
            if isinstance(exc, IntegrityError) and records_renamed(rows):
                await self._flush(batch)
                return
            if not done.done():
                done.set_exception(_failure(rows))
            if isinstance(exc, IntegrityError):
                # A row the database refuses (a constraint): said in one line, no traceback.
                logger.warning("Could not store %s: %s", _describe(rows), str(exc).strip())
            else:
                logger.exception("Could not store %s", _describe(rows))
            metrics.PERSISTENCE_FAILURES.labels("lost").inc()
            return
        for _, done in batch:
            if not done.done():
                done.set_result(None)


def _conversations_of(rows: Rows) -> set[uuid.UUID]:
    """The conversations ``rows`` write to: the same before and after ``deleted_dropped``
    (which leaves out their messages, not ``unless_deleted``)."""
    ids = {message["conversation_id"] for message in rows.messages}
    ids.update(conversation["id"] for conversation in rows.conversations)
    if rows.unless_deleted is not None:
        ids.add(rows.unless_deleted)
    return ids


def _pause(taken_at: float, now: float) -> float:
    """Seconds the writer waits before taking its next batch, the last taken at ``taken_at``:
    the rest of ``PERSIST_BATCH_MS`` since then with at least ``PERSIST_BATCH_FROM`` answers
    running in this process, else none."""
    config = settings.CHATSITE_STREAM
    every_s = config["PERSIST_BATCH_MS"] / 1000
    if every_s <= 0 or answers_running_count() < config["PERSIST_BATCH_FROM"]:
        return 0.0
    return max(0.0, taken_at + every_s - now)


async def _write_retrying(batch: list[Rows]) -> None:
    """Write ``batch``; while the database is unreachable or failing over, try again with
    growing pauses for up to ``CHATSITE_PERSIST_RETRY_S``. Streams go on meanwhile: their rows
    wait here, in order. A row the database refuses (a constraint) is not retried."""
    budget = settings.CHATSITE_STREAM["PERSIST_RETRY_S"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    pause = 0.2
    while True:
        try:
            await run_db_write(rows_write, batch)
            return
        except (OperationalError, InterfaceError) as exc:
            if loop.time() + pause > deadline:
                raise
            metrics.PERSISTENCE_FAILURES.labels("retried").inc()
            logger.warning("Database unavailable (%s); retrying in %.1f s", exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)


class PersistenceFailed(Exception):
    """Rows could not be stored (logged with the cause)."""


def _failure(rows: Rows) -> PersistenceFailed:
    return PersistenceFailed(f"could not store {_describe(rows)}")


def _describe(rows: Rows) -> str:
    ids = [str(m["id"]) for m in rows.messages] + [str(c["id"]) for c in rows.conversations]
    ids += [f"record {r['request_id']}" for r in rows.records]
    return f"rows {', '.join(ids) or '(none)'}"


_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupWriter] = (
    weakref.WeakKeyDictionary()
)


def rows_submit(rows: Rows) -> asyncio.Future[None]:
    """Hand ``rows`` to the running loop's group writer (``GroupWriter.submit``): awaiting
    several such futures at once takes no task for each, as ``rows_store`` coroutines would."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = GroupWriter()
    return writer.submit(rows)


def rows_writing(conversation_id: uuid.UUID) -> bool:
    """Whether the running loop's writer holds rows of ``conversation_id`` not written yet."""
    writer = _writers.get(asyncio.get_running_loop())
    return writer is not None and writer.writing(conversation_id)


def rows_held(conversation_id: uuid.UUID) -> list[Row] | None:
    """``GroupWriter.held`` of the running loop's writer (nothing held where it has none)."""
    writer = _writers.get(asyncio.get_running_loop())
    return [] if writer is None else writer.held(conversation_id)


async def rows_written(conversation_id: uuid.UUID) -> None:
    """``GroupWriter.written`` of the running loop's writer."""
    writer = _writers.get(asyncio.get_running_loop())
    if writer is not None:
        await writer.written(conversation_id)


async def rows_store(rows: Rows) -> None:
    """Store ``rows`` through the running loop's group writer."""
    await asyncio.shield(rows_submit(rows))


def rows_hand_over(rows: Rows) -> None:
    """Hand ``rows`` to the running loop's group writer, and wait for nothing: no task waits
    for them to be stored (``rows_store`` in a task of its own would). For rows that are waited
    for all the same: a question's, which its answer's store (held until done, and waited for
    at shutdown) follows through the same writer, in order. A failure is the writer's to log
    and count (``GroupWriter._flush``); it is only taken out of the future here."""
    rows_submit(rows).add_done_callback(failure_taken)
