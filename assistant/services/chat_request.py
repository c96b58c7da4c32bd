"""Validating a chat request: the JSON body and the request id."""

import json
import re
import uuid
from dataclasses import dataclass

from django.utils.translation import gettext

from assistant import conf, errors
from assistant.errors import Rejected
from assistant.ids import ordered_uuid

_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{8,64}")
#: Characters no database stores as text: NUL, and halves of a UTF-16 pair without the other.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


#: What the page showed of the student's class: its id (None: no class), and whether it said
#: the class's teachers read the questions; None: the client did not say.
ClassShown = tuple[uuid.UUID | None, bool] | None


@dataclass(frozen=True, slots=True)
class ChatTurn:
    message: str
    conversation_id: uuid.UUID | None
    #: The question this one replaces (edited and sent again, or asked again to regenerate its
    #: answer): it and everything after it are set aside once this one is stored.
    replaces: uuid.UUID | None = None
    #: What the page showed of the student's class: its id (None: no class) and whether its
    #: teachers read the questions; None when the client did not say (``class_shown_check``).
    shown: ClassShown = None


def request_id_valid(value: object) -> bool:
    """A request id this site could have used: 8-64 of ``[A-Za-z0-9._-]``."""
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


def request_id_choose(incoming: str | None) -> str:
    """Reuse a proxy's request id when it looks like one, so logs join up; else a new one."""
    if request_id_valid(incoming):
        return incoming  # type: ignore[return-value]
    return ordered_uuid().hex


def chat_turn_parse(body: bytes) -> ChatTurn:
    """Validate the JSON body ``{"message": str, "conversation": uuid | null}``, with
    ``"replaces": uuid`` (a question of that conversation) to edit or regenerate, and
    ``"class": uuid | null, "teachers_read": bool`` for what the page showed of the class."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Rejected(errors.INVALID_JSON) from None
    if not isinstance(payload, dict):
        raise Rejected(errors.INVALID_BODY)
    message = payload.get("message")
    if message is not None and not isinstance(message, str):
        raise Rejected(errors.INVALID_BODY)
    if not message or not message.strip():
        raise Rejected(errors.MESSAGE_MISSING)
    if _UNSTORABLE.search(message):
        raise Rejected(errors.MESSAGE_UNREADABLE)
    limit = conf.settings.CHATSITE_STREAM["MAX_MESSAGE_CHARS"]
    if len(message) > limit:
        raise Rejected(
            errors.MESSAGE_TOO_LONG.with_message(
                gettext("The message is longer than %(limit)d characters.") % {"limit": limit}
            )
        )
    raw_conversation = payload.get("conversation")
    raw_replaces = payload.get("replaces")
    shown = _class_shown(payload)
    if raw_conversation is None:
        if raw_replaces is not None:
            raise Rejected(errors.INVALID_REPLACES)
        return ChatTurn(message=message, conversation_id=None, shown=shown)
    return ChatTurn(
        message=message,
        conversation_id=_uuid(raw_conversation, errors.INVALID_CONVERSATION),
        replaces=None if raw_replaces is None else _uuid(raw_replaces, errors.INVALID_REPLACES),
        shown=shown,
    )


def _class_shown(payload: dict[str, object]) -> ClassShown:
    """``"class": uuid | null`` with ``"teachers_read": bool``, as the page sends them."""
    if "class" not in payload:
        return None
    raw_class, reads = payload["class"], payload.get("teachers_read", False)
    if not isinstance(reads, bool):
        raise Rejected(errors.INVALID_BODY)
    return (None if raw_class is None else _uuid(raw_class, errors.INVALID_BODY)), reads


def _uuid(value: object, error: errors.ApiError) -> uuid.UUID:
    if not isinstance(value, str):
        raise Rejected(error)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise Rejected(error) from None
