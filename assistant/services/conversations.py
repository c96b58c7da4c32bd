"""Conversation persistence. Synchronous ORM functions: call them through ``run_db``."""

import uuid
from dataclasses import dataclass

from django.db import transaction

from assistant.engines import ChatMessage
from assistant.models import Conversation, Message

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


def exchange_begin(*, owner_key: str, exchange: Exchange, question: str) -> None:
    """Store the student's question (and the conversation, when it is new)."""
    with transaction.atomic():
        if exchange.is_new_conversation:
            Conversation.objects.create(
                id=exchange.conversation_id,
                owner_key=owner_key,
                title=" ".join(question.split())[:TITLE_CHARS],
            )
        Message.objects.create(
            id=exchange.user_message_id,
            conversation_id=exchange.conversation_id,
            role=Message.Role.USER,
            content=question,
            request_id=exchange.request_id,
        )


def answer_save(
    *, exchange: Exchange, content: str, status: Message.Status, finish_reason: str
) -> Message:
    """Store the assistant's answer, complete or partial; touch the conversation."""
    with transaction.atomic():
        message = Message.objects.create(
            id=exchange.answer_message_id,
            conversation_id=exchange.conversation_id,
            role=Message.Role.ASSISTANT,
            content=content,
            status=status,
            finish_reason=finish_reason,
            request_id=exchange.request_id,
        )
        Conversation.objects.filter(id=exchange.conversation_id).update(
            updated_at=message.created_at
        )
    return message
