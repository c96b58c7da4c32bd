"""Read-only queries for the pages and the history API."""

import uuid
from typing import Any

from assistant.models import Conversation, Message


def conversation_list(
    *, owner_key: str, classroom_id: uuid.UUID | None, limit: int = 50
) -> list[dict[str, Any]]:
    """The owner's latest conversations begun in ``classroom_id`` (None: in no class)."""
    rows = Conversation.objects.filter(owner_key=owner_key, classroom_id=classroom_id).values(
        "id", "title", "created_at", "updated_at"
    )[:limit]
    return [
        {
            **row,
            "id": str(row["id"]),
            "created_at": row["created_at"].isoformat(),
            "updated_at": row["updated_at"].isoformat(),
        }
        for row in rows
    ]


def conversation_messages(
    *, owner_key: str, conversation_id: uuid.UUID
) -> list[dict[str, Any]] | None:
    """The messages of the owner's conversation, or None if it is not theirs (or does not exist)."""
    if not Conversation.objects.filter(id=conversation_id, owner_key=owner_key).exists():
        return None
    # What an edited or regenerated question replaced stays stored, and is not shown.
    rows = Message.objects.filter(conversation_id=conversation_id, replaced_at__isnull=True).values(
        "id", "role", "content", "status", "finish_reason", "created_at"
    )
    return [
        {**row, "id": str(row["id"]), "created_at": row["created_at"].isoformat()} for row in rows
    ]


def answer_saved(*, owner_key: str, request_id: str) -> dict[str, Any] | None:
    """The stored answer of the owner's request ``request_id`` (perhaps partial), if any."""
    row = (
        Message.objects.filter(
            request_id=request_id,
            role=Message.Role.ASSISTANT,
            conversation__owner_key=owner_key,
        )
        .values("id", "conversation_id", "content", "status", "finish_reason")
        .first()
    )
    if row is None:
        return None
    return {**row, "id": str(row["id"]), "conversation_id": str(row["conversation_id"])}
