"""Classes as an answer sees them, and students joining and leaving them.

A student's class lives in their session (``SESSION_CLASS``), read in the same trip to a database
thread that resolves who is asking, together with the class's row: what reaches the engine (the
persona, the sampling, the engine alias) and whether the class is open are never older than that
read. (A new question admitted by the event loop's own Redis client, ``services/loop_admission.py``,
takes this process's last read instead, only while its version is the stored one:
``services/class_versions.py``.)

A new conversation starts its engine *before* that trip (``services/answer_start.py``), so it
needs a guess first: the ``chatsite_class`` cookie names the class, and this process keeps the
last context it read for each class (``class_guess``). When the trip finds something else (the
student left in another tab, the teacher changed the persona), the early start is thrown away and
the engine starts again from what was read: a guess can cost some engine work, never a wrong
answer.
"""

import ipaddress
import re
import secrets
import uuid
from dataclasses import dataclass, replace
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from assistant import conf, errors
from assistant.engines import GenerationParams
from assistant.errors import Rejected
from assistant.models import ClassMember, Classroom
from assistant.services.ratelimit import rate_limit_forgive, rate_limit_hit

#: The session key holding the student's class id.
SESSION_CLASS = "classroom"
#: The cookie naming the student's class for the early engine start (a guess, never trusted).
CLASS_COOKIE = "chatsite_class"
#: Join codes: no 0/O, 1/I/L, so a code read aloud or off a board is typed right.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 6
#: Wrong codes one address may try per minute (right ones are not counted: a class behind one
#: NAT joins at once).
JOIN_TRIES_PER_MINUTE = 60
NICKNAME_CHARS = 40
_NICKNAME = re.compile(r"[^\x00-\x1f\x7f]*")


@dataclass(frozen=True, slots=True)
class ClassContext:
    """What an answer needs of its student's class, read with the session."""

    id: uuid.UUID
    #: The row's ``updated_at``: a guess is good when its version is the stored one.
    version: datetime
    name: str
    paused: bool
    persona: str
    temperature: float | None
    max_tokens: int | None
    engine_alias: str
    chat_rate: int | None
    teachers_read: bool

    @classmethod
    def of(cls, row: Classroom) -> "ClassContext":
        return cls(
            id=row.id,
            version=row.updated_at,
            name=row.name,
            paused=row.paused,
            persona=row.persona,
            temperature=row.temperature,
            max_tokens=row.max_tokens,
            engine_alias=row.engine_alias,
            chat_rate=row.chat_rate,
            teachers_read=row.teachers_read,
        )


def system_prompt(context: ClassContext | None) -> str:
    """The system prompt answers start from: the class's persona, else the site's."""
    if context is not None and context.persona.strip():
        return context.persona
    return conf.settings.CHATSITE_STREAM["SYSTEM_PROMPT"]


def generation_for(base: GenerationParams, context: ClassContext | None) -> GenerationParams:
    """``base`` (the engine alias's sampling) with the class's own settings over it."""
    if context is None:
        return base
    overrides: dict[str, float | int] = {}
    if context.temperature is not None:
        overrides["temperature"] = context.temperature
    if context.max_tokens is not None:
        overrides["max_tokens"] = context.max_tokens
    return replace(base, **overrides) if overrides else base


def engine_alias_for(path_alias: str, context: ClassContext | None) -> str:
    """The engine alias that answers: the class's when it names one, else the serving path's."""
    if context is not None and context.engine_alias in settings.CHATSITE_ENGINES:
        return context.engine_alias
    return path_alias


def chat_rate_for(context: ClassContext | None) -> int:
    """Questions a student may ask per minute."""
    if context is not None and context.chat_rate is not None:
        return context.chat_rate
    return conf.settings.CHATSITE_RATE_LIMITS["chat"][0]


#: This process's last read of each class, by id, for the early engine start's guess.
_known: dict[str, ClassContext] = {}


def class_guess(hint: str | None) -> tuple[bool, ClassContext | None]:
    """From the class cookie alone, no I/O: (True, context) when the class it names was read
    here before (None: no cookie, no class); (False, None) when unknown here: start nothing
    before the session is read."""
    if not hint:
        return True, None
    context = _known.get(hint)
    return (context is not None), context


def class_context_load(classroom_id: str | None) -> ClassContext | None:
    """Synchronous (ORM): the class's context now; None for no class or one deleted since."""
    if not classroom_id:
        return None
    try:
        row = Classroom.objects.get(id=classroom_id)
    except (Classroom.DoesNotExist, ValidationError, ValueError, TypeError):
        _known.pop(str(classroom_id), None)
        return None
    return class_context_known(row)


def class_context_known(row: Classroom) -> ClassContext:
    """``row``'s context, kept as this process's last read of the class (the guesses')."""
    context = ClassContext.of(row)
    _known[str(row.id)] = context
    return context


def class_paused_check(context: ClassContext | None) -> None:
    """Refuse a question to a paused class (403 ``class_paused``)."""
    if context is not None and context.paused:
        raise Rejected(errors.CLASS_PAUSED)


def class_shown_check(
    shown: tuple[uuid.UUID | None, bool] | None, classroom: ClassContext | None
) -> None:
    """Refuse (409 ``class_changed``) a question sent from a page that showed another class, or
    said otherwise of what its teachers read, than holds now: the student is told before they
    ask, never after. A client that did not say what it showed is not checked."""
    if shown is None:
        return
    now = (None, False) if classroom is None else (classroom.id, classroom.teachers_read)
    if shown != now:
        raise Rejected(errors.CLASS_CHANGED)


def join_code_new() -> str:
    """A fresh random code, unused by any class."""
    while True:
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        if not Classroom.objects.filter(join_code=code).exists():
            return code


def join_code_normalise(typed: str) -> str:
    """What a student typed, as codes are stored: upper case, no spaces or dashes."""
    return re.sub(r"[\s-]+", "", typed).upper()


def join_code_rotate(classroom: Classroom) -> str:
    """Give the class a new code; the old one stops working at once."""
    classroom.join_code = join_code_new()
    classroom.save(update_fields=["join_code", "updated_at"])
    return classroom.join_code


def nickname_parse(value: object) -> str:
    """A nickname from a form: optional, one line, at most ``NICKNAME_CHARS`` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Rejected(errors.NICKNAME_INVALID)
    nickname = " ".join(value.split())
    if len(nickname) > NICKNAME_CHARS or not _NICKNAME.fullmatch(nickname):
        raise Rejected(errors.NICKNAME_INVALID)
    return nickname


def join_limit_key(client: str) -> str:
    """Whose wrong codes count together: an IPv4 address, or an IPv6 address's /64 (one
    household or school is given a whole /64, and would otherwise have billions of tries)."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return client


def class_by_code(code: str, *, client: str) -> Classroom:
    """The class a join code opens: 404 ``join_code_unknown``, 410 ``join_code_expired``.

    Only wrong codes count against ``client``'s ``JOIN_TRIES_PER_MINUTE`` (a class behind one
    address joins at once). Every try is counted first, atomically, and a right one given back:
    an address over the limit is refused (429) whatever its code, so it cannot tell a right
    code from a wrong one, and tries sent at once cannot all slip under the limit."""
    key = join_limit_key(client)
    retry_after = rate_limit_hit(scope="join", key=key, limit=JOIN_TRIES_PER_MINUTE, window_s=60)
    if retry_after is not None:
        raise Rejected(errors.RATE_LIMITED, retry_after=retry_after)
    normalised = join_code_normalise(code)
    row = Classroom.objects.filter(join_code=normalised).first() if normalised else None
    if row is None:
        raise Rejected(errors.JOIN_CODE_UNKNOWN)
    if row.code_expires_at is not None and row.code_expires_at <= timezone.now():
        raise Rejected(errors.JOIN_CODE_EXPIRED)
    rate_limit_forgive(scope="join", key=key, window_s=60)
    return row


def class_join(session: object, *, owner_key: str, classroom: Classroom, nickname: str) -> None:
    """Make ``session`` (whose owner is ``owner_key``) a member of ``classroom``, leaving the
    class it was in. Its conversations from now on are the class's."""
    class_leave(session, owner_key=owner_key)
    member = (
        ClassMember.objects.filter(classroom=classroom, owner_key=owner_key)
        .order_by("-joined_at")
        .first()
    )
    if member is None:
        ClassMember.objects.create(classroom=classroom, owner_key=owner_key, nickname=nickname)
    else:
        member.nickname = nickname or member.nickname
        member.left_at = None
        member.save(update_fields=["nickname", "left_at"])
    session[SESSION_CLASS] = str(classroom.id)  # type: ignore[index]


def class_leave(session: object, *, owner_key: str) -> None:
    """Take ``session`` out of its class, if it is in one."""
    classroom_id = session.pop(SESSION_CLASS, None)  # type: ignore[attr-defined]
    if classroom_id:
        ClassMember.objects.filter(
            classroom_id=classroom_id, owner_key=owner_key, left_at__isnull=True
        ).update(left_at=timezone.now())


def session_class(session: object) -> ClassContext | None:
    """Synchronous (ORM): the context of the class ``session`` belongs to, if any."""
    return class_context_load(session.get(SESSION_CLASS))  # type: ignore[attr-defined]
