"""Conversations: reading history (synchronous ORM, through ``run_db``, or by the event loop's
own connection on PostgreSQL), the rows a stream stores (through
``assistant.services.persistence``), and their owner renaming or deleting them."""

import asyncio
import functools
import json
import logging
import unicodedata
import uuid
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils.translation import gettext

from assistant import errors
from assistant.engines import ChatMessage
from assistant.errors import Rejected
from assistant.loop_postgres import Rows as LoopRows
from assistant.loop_postgres import loop_reads
from assistant.models import Conversation, Message, StreamRecord
from assistant.services.background import failure_taken
from assistant.services.chat_request import _UNSTORABLE
from assistant.services.deleted_marks import deleted_key, deleted_look
from assistant.services.persistence import (
    PersistenceFailed,
    Rows,
    rows_held,
    rows_submit,
    rows_writing,
    rows_written,
)
from assistant.services.ratelimit import rate_limit_hit
from assistant.services.table_rows import Row
from assistant.services.telemetry import AnswerSummary, stream_record

logger = logging.getLogger(__name__)

TITLE_CHARS = 60
#: How long a deleted conversation stays marked deleted in the cache (shared by the workers), so
#: that an answer still running in it stores no text when it ends (``answer_store``): longer
#: than answers run.
DELETED_KEEP_S = 3600


class ConversationNotFound(Exception):
    """No conversation with this id belongs to this owner."""


@dataclass(frozen=True, slots=True)
class Exchange:
    """One question and its answer: ids chosen up front so the stream can announce them."""

    conversation_id: uuid.UUID
    user_message_id: uuid.UUID
    answer_message_id: uuid.UUID
    is_new_conversation: bool
    request_id: str
    #: The question this exchange replaces (``ChatTurn.replaces``).
    replaces: uuid.UUID | None = None


#: The longest a follow-up question waits for its conversation's rows still being written
#: (``conversation_written``); past it, the database is failing over or far behind, and the
#: question goes on with what is stored.
WRITTEN_WAIT_S = 3.0


def history_held(conversation_id: uuid.UUID | None, replaces: uuid.UUID | None) -> list[Row] | None:
    """What a follow-up question's history read is completed with (``history_completed``): the
    messages of ``conversation_id`` this loop's group writer holds, not stored yet (usually the
    answer that has just ended, which the writer stores in its next batch). None: nothing can
    complete it, and the read must wait for what is held (``conversation_written``): a new
    conversation's rows, a question set aside, or a question replacing another (whose history
    ends before it)."""
    if conversation_id is None or replaces is not None:
        return None
    return rows_held(conversation_id)


def history_completed(
    stored: Iterable[tuple[Any, str | None, str | None]], held: Sequence[Row], limit: int
) -> list[ChatMessage]:
    """The last ``limit`` messages of a conversation, oldest first: ``stored`` (its last
    ``limit`` stored messages, newest first, as ``(id, role, content)``; an empty role: none)
    followed by ``held`` (``history_held``, in the order handed to the writer), newer than any
    stored, but the empty and those stored meanwhile. The writer stores in that order, so
    those are the held up to the last one ``stored`` has (the newest stored message; the
    earlier may be past ``limit``)."""
    found = [(key, role, content) for key, role, content in stored if role]
    have = {key for key, _, _ in found}
    messages = [ChatMessage(role=role, content=content or "") for key, role, content in found]
    messages.reverse()
    last = max((i for i, m in enumerate(held) if m["id"] in have), default=-1)
    messages += (
        ChatMessage(role=str(m["role"]), content=m["content"])
        for m in held[last + 1 :]
        if m["content"]
    )
    return messages[-limit:]


async def conversation_written(conversation_id: uuid.UUID) -> None:
    """Return once what this loop's group writer was handed of ``conversation_id`` is stored (at
    once when nothing is waiting, the usual case), or after ``WRITTEN_WAIT_S``: the history read
    next then has the answer that was just sent, however late the writer stores it. A write
    that failed is not raised here (it was logged; the read finds what was stored)."""
    if not rows_writing(conversation_id):
        return
    try:
        async with asyncio.timeout(WRITTEN_WAIT_S):
            await rows_written(conversation_id)
    except TimeoutError:
        pass


def conversation_history(
    *,
    owner_key: str,
    classroom_id: uuid.UUID | None,
    conversation_id: uuid.UUID,
    limit: int,
    before: uuid.UUID | None = None,
    held: Sequence[Row] = (),
) -> list[ChatMessage]:
    """The last ``limit`` messages of the owner's conversation in ``classroom_id`` (None: one
    begun in no class), oldest first, leaving out what was replaced; with ``before`` (a question
    being replaced), only the messages before it; completed with ``held``, the messages not
    stored yet (``history_held``).

    Raises ``ConversationNotFound``, or ``Rejected`` when ``before`` is not one of the
    conversation's questions (``invalid_replaces``) or was replaced already
    (``question_replaced``).
    """
    if not Conversation.objects.filter(
        id=conversation_id, owner_key=owner_key, classroom_id=classroom_id
    ).exists():
        raise ConversationNotFound(str(conversation_id))
    messages = Message.objects.filter(conversation_id=conversation_id, replaced_at__isnull=True)
    if before is not None:
        question = (
            Message.objects.filter(
                id=before, conversation_id=conversation_id, role=Message.Role.USER
            )
            .values_list("created_at", "replaced_at")
            .first()
        )
        if question is None:
            raise Rejected(errors.INVALID_REPLACES)
        if question[1] is not None:
            raise Rejected(errors.QUESTION_REPLACED)
        messages = messages.filter(created_at__lt=question[0])
    recent = messages.exclude(content="").order_by("-created_at")
    return history_completed(recent.values_list("id", "role", "content")[:limit], held, limit)


def history_on_loop(
    *,
    owner_key: str,
    classroom_id: uuid.UUID | None,
    conversation_id: uuid.UUID,
    limit: int,
    held: Sequence[Row] = (),
) -> Coroutine[Any, Any, list[ChatMessage] | None] | None:
    """``conversation_history`` (with no ``before``) read by the event loop's own connection
    (``assistant/loop_postgres.py``), where the loop has one; None where it cannot be tried.
    The read is queued at once, for the loop's next batch; the coroutine gives its messages,
    and may be closed unawaited (the read is then dropped). The coroutine's None: a thread must
    tell (no such conversation of this owner and class, to be refused there; the database did
    not answer)."""
    reads = loop_reads()
    if reads is None:
        return None
    asked = reads.rows(_history_sql(), (limit, conversation_id, owner_key, classroom_id))
    asked.add_done_callback(failure_taken)  # a dropped read's failure is nobody's to log
    return _history_read(asked, held, limit)


async def _history_read(
    asked: "asyncio.Future[LoopRows]", held: Sequence[Row], limit: int
) -> list[ChatMessage] | None:
    try:
        rows = await asked
    except Exception:
        return None  # the thread's read answers (or fails) as it always has
    if not rows:
        return None  # not this owner's conversation in this class: the thread refuses it
    # Newest first, as the ORM's query; a conversation with no message yet is one empty row.
    return history_completed(rows, held, limit)


@functools.cache
def _history_sql() -> str:
    """``conversation_history``'s two queries as one: the conversation, if it is the owner's in
    that class, and its last messages (those not replaced and not empty), newest first."""
    conversations, messages = (f'"{model._meta.db_table}"' for model in (Conversation, Message))
    return (
        "SELECT m.id, m.role, m.content FROM "
        f"{conversations} AS c LEFT JOIN LATERAL (SELECT id, role, content, created_at FROM "
        f"{messages} WHERE conversation_id = c.id AND replaced_at IS NULL AND content <> '' "
        "ORDER BY created_at DESC LIMIT %s) AS m ON TRUE "
        "WHERE c.id = %s AND c.owner_key = %s AND c.classroom_id IS NOT DISTINCT FROM %s::uuid "
        "ORDER BY m.created_at DESC"
    )


def question_rows(
    *, owner_key: str, classroom_id: uuid.UUID | None, exchange: Exchange, question: str
) -> Rows:
    """The student's question (and the conversation, in their class, when it is new), ready to
    store."""
    rows = Rows()
    if exchange.is_new_conversation:
        rows.conversations.append(
            {
                "id": exchange.conversation_id,
                "owner_key": owner_key,
                "classroom_id": classroom_id,
                "title": " ".join(question.split())[:TITLE_CHARS],
            }
        )
    if exchange.replaces is not None:
        rows.replaced.append(
            (exchange.conversation_id, exchange.replaces, exchange.user_message_id)
        )
    rows.messages.append(
        {
            "id": exchange.user_message_id,
            "conversation_id": exchange.conversation_id,
            "role": Message.Role.USER,
            "content": question,
            "request_id": exchange.request_id,
        }
    )
    return rows


def answer_rows(
    *, exchange: Exchange, content: str, outcome: StreamRecord.Outcome, finish_reason: str
) -> Rows:
    """The assistant's answer, complete or partial, ready to store; it touches the conversation."""
    if outcome == StreamRecord.Outcome.OK:
        status = Message.Status.COMPLETE
    else:
        status = Message.Status.PARTIAL if content else Message.Status.FAILED
    answer = {
        "id": exchange.answer_message_id,
        "conversation_id": exchange.conversation_id,
        "role": Message.Role.ASSISTANT,
        "content": content,
        "status": status,
        "finish_reason": finish_reason,
        "request_id": exchange.request_id,
    }
    return Rows(messages=[answer], touch=[exchange.conversation_id])


async def answer_store(rows: Rows, summary: AnswerSummary) -> None:
    """Store an ended answer's rows and its record. Written after the question by the same
    writer; if the question failed, so does this. The record is submitted apart (usually in the
    same transaction): a request id used twice must not cost the answer.

    When the answer's conversation was deleted while it ran (``conversation_delete``), only the
    record is stored, and one info line says so: nothing comes back to life. The database
    refuses the answer's message (its conversation is gone), and the writer then looks for the
    cache's marks of its batch's conversations (``deleted_marks.deleted_dropped``) and writes the
    rest again. If the refusal came before the conversation's mark (the moment between the
    delete and the mark), the writer refuses the rows (one warning line of its own), and this
    looks again and ends in the same info line rather than a failure.
    """
    record = Rows(records=[stream_record(summary)])
    rows.unless_deleted = summary.conversation_id  # looked for if the writer is refused
    stored, recorded = await asyncio.gather(
        rows_submit(rows), rows_submit(record), return_exceptions=True
    )
    if rows.dropped or (
        isinstance(stored, PersistenceFailed)
        and await _conversation_deleted(summary.conversation_id)
    ):
        _answer_dropped(summary)
        stored = None
    for outcome in (stored, recorded):
        if isinstance(outcome, BaseException):
            raise outcome


def _answer_dropped(summary: AnswerSummary) -> None:
    logger.info(
        "Conversation %s was deleted while answer %s ran: its record is stored, its text is not",
        summary.conversation_id,
        summary.request_id,
    )


async def _conversation_deleted(conversation_id: uuid.UUID) -> bool:
    """Whether ``conversation_delete`` deleted this conversation lately (its mark in the
    cache, ``deleted_marks.deleted_marked``). False when the cache cannot say: the writer's
    refusal is the last word then."""
    return conversation_id in await deleted_look({conversation_id})


def conversation_title_parse(body: bytes) -> str:
    """Validate a rename's JSON body ``{"title": str}``; the title, trimmed.

    Raises ``Rejected`` (400): ``invalid_json``; ``title_invalid`` (not an object, or the title
    not a string); ``title_missing`` (nothing left once trimmed); ``title_unreadable`` (a control
    character, or one no database stores: ``chat_request._UNSTORABLE``); ``title_too_long``
    (longer than ``Conversation.title``'s ``max_length``, once trimmed).
    """
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Rejected(errors.INVALID_JSON) from None
    title = payload.get("title") if isinstance(payload, dict) else None
    if not isinstance(title, str):
        raise Rejected(errors.TITLE_INVALID)
    title = title.strip()
    if not title:
        raise Rejected(errors.TITLE_MISSING)
    if _UNSTORABLE.search(title) or any(unicodedata.category(c) == "Cc" for c in title):
        raise Rejected(errors.TITLE_UNREADABLE)
    limit = Conversation._meta.get_field("title").max_length
    if limit is not None and len(title) > limit:
        message = gettext("The title is longer than %(limit)d characters.") % {"limit": limit}
        raise Rejected(errors.TITLE_TOO_LONG.with_message(message))
    return title


def _edit_admit(owner_key: str) -> None:
    """Count a rename or a delete against the owner's rate: the chat rate, counted apart from
    questions (``Rejected``, 429 with Retry-After, when over it)."""
    limit, window = settings.CHATSITE_RATE_LIMITS["chat"]
    retry_after = rate_limit_hit(scope="conversation", key=owner_key, limit=limit, window_s=window)
    if retry_after is not None:
        raise Rejected(errors.RATE_LIMITED, retry_after=retry_after)


def conversation_rename(*, owner_key: str, conversation_id: uuid.UUID, title: str) -> None:
    """Synchronous (ORM): give the owner's conversation ``title`` (``conversation_title_parse``'s).
    Its ``updated_at`` stays: a new answer moves a conversation up the list, a rename does not.

    Raises ``Rejected`` (429) over the rate, ``ConversationNotFound`` when it is not theirs.
    """
    _edit_admit(owner_key)
    renamed = Conversation.objects.filter(id=conversation_id, owner_key=owner_key).update(
        title=title
    )
    if not renamed:
        raise ConversationNotFound(str(conversation_id))


def conversation_delete(*, owner_key: str, conversation_id: uuid.UUID) -> None:
    """Synchronous (ORM): delete the owner's conversation and its messages.

    Its stream records (``StreamRecord``) stay as they are: they are telemetry, hold no text
    (ids, the owner's pseudonym, outcomes and timings), and the dashboard's figures count them;
    their ``conversation_id`` and ``message_id`` (plain ids, not foreign keys) then point at
    nothing, and a late beacon still joins its record.

    An answer may still be running in it, in this worker or another: the conversation is marked
    deleted in the cache for ``DELETED_KEEP_S``, so that when the answer ends it stores its
    record and not its text (``answer_store``). The row is locked first (PostgreSQL; SQLite's
    writers take turns anyway), so an answer written meanwhile is deleted with it or refused
    after it, never left behind.

    Raises ``Rejected`` (429) over the rate, ``ConversationNotFound`` when it is not theirs.
    """
    _edit_admit(owner_key)
    with transaction.atomic():
        mine = Conversation.objects.select_for_update().filter(
            id=conversation_id, owner_key=owner_key
        )
        if not list(mine.values_list("id", flat=True)):
            raise ConversationNotFound(str(conversation_id))
        mine.delete()
    try:
        cache.set(deleted_key(conversation_id), True, timeout=DELETED_KEEP_S)
    except Exception:
        # Deleted all the same; a running answer's rows are then refused by the writer.
        logger.warning("Could not mark conversation %s deleted in the cache", conversation_id)
