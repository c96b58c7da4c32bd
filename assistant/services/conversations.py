"""Conversations: reading history (synchronous ORM, through ``run_db``) and the rows a stream
stores (through ``assistant.services.persistence``)."""

import asyncio
import uuid
from dataclasses import dataclass

from assistant.engines import ChatMessage
from assistant.models import Conversation, Message, StreamRecord
from assistant.services.persistence import Rows, rows_store
from assistant.services.telemetry import AnswerSummary, stream_record

TITLE_CHARS = 60


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


def conversation_history(
    *, owner_key: str, conversation_id: uuid.UUID, limit: int
) -> list[ChatMessage]:
    """The last ``limit`` messages of the owner's conversation, oldest first."""
    if not Conversation.objects.filter(id=conversation_id, owner_key=owner_key).exists():
        raise ConversationNotFound(str(conversation_id))
    recent = (
        Message.objects.filter(conversation_id=conversation_id)
        .exclude(content="")
        .order_by("-created_at")
        .values_list("role", "content")[:limit]
    )
    return [ChatMessage(role=role, content=content) for role, content in reversed(recent)]


def question_rows(*, owner_key: str, exchange: Exchange, question: str) -> Rows:
    """The student's question (and the conversation, when it is new), ready to store."""
    rows = Rows()
    if exchange.is_new_conversation:
        rows.conversations.append(
            Conversation(
                id=exchange.conversation_id,
                owner_key=owner_key,
                title=" ".join(question.split())[:TITLE_CHARS],
            )
        )
    rows.messages.append(
        Message(
            id=exchange.user_message_id,
            conversation_id=exchange.conversation_id,
            role=Message.Role.USER,
            content=question,
            request_id=exchange.request_id,
        )
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
    answer = Message(
        id=exchange.answer_message_id,
        conversation_id=exchange.conversation_id,
        role=Message.Role.ASSISTANT,
        content=content,
        status=status,
        finish_reason=finish_reason,
        request_id=exchange.request_id,
    )
    return Rows(messages=[answer], touch=[exchange.conversation_id])


async def answer_store(rows: Rows, summary: AnswerSummary) -> None:
    """Store an ended answer's rows and its record. Written after the question by the same
    writer; if the question failed, so does this. The record is submitted apart (usually in the
    same transaction): a request id used twice must not cost the answer."""
    await asyncio.gather(rows_store(rows), rows_store(Rows(records=[stream_record(summary)])))
