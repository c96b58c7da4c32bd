"""API keys for the OpenAI-compatible API (``/v1/``): made, shown once, stored as a hash.

A key reads ``csk-<prefix>-<secret>``. The prefix (10 characters) finds its row, and is what
lists and logs show; the secret (256 random bits) never leaves the response that created the
key. Only SHA-256 of the whole key is stored: a slow password hash buys nothing against 256
random bits, and the check stays a few microseconds.

Each request reads its key's row, class and rate in one trip to a database thread
(``key_admitted``), so a revoked key is refused from the next request on. Meanwhile the engine may
already be working: each process remembers its last read of each key (``key_guess``), and a
known key's answer starts on that read's class, as a page's class guess does
(``services/answer_open.py``); a read that disagrees closes it before any token is sent.
"""

import hashlib
import hmac
import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from assistant import errors
from assistant.errors import Rejected
from assistant.models import ApiKey, Classroom
from assistant.services.admission import SlotTry
from assistant.services.classrooms import ClassContext, class_context_known, class_paused_check
from assistant.services.identity import Identity
from assistant.services.ratelimit import rate_limit_hit

KEY_START = "csk-"
PREFIX_LENGTH = 10
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
#: The owner key of everything a key asks: its conversations and records.
OWNER_PREFIX = "key:"


@dataclass(frozen=True, slots=True)
class KeyPresented:
    """A key as a request presents it: its prefix, and the digest of the whole."""

    prefix: str
    digest: str


@dataclass(frozen=True, slots=True)
class KeyContext:
    """What a request needs of its key, as read last in this process."""

    id: uuid.UUID
    digest: str
    classroom: ClassContext | None

    @property
    def owner_key(self) -> str:
        return f"{OWNER_PREFIX}{self.id}"


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_new() -> tuple[str, str, str]:
    """A fresh key: (the key, its prefix, its digest)."""
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))
    key = f"{KEY_START}{prefix}-{secrets.token_urlsafe(32)}"
    return key, prefix, key_digest(key)


def key_create(
    *, name: str, classroom: Classroom | None, created_by: Any, rate: int | None = None
) -> tuple[ApiKey, str]:
    """Store a new key and return it with its text, which is shown once and never again."""
    key, prefix, digest = key_new()
    while ApiKey.objects.filter(prefix=prefix).exists():
        key, prefix, digest = key_new()
    row = ApiKey.objects.create(
        name=name,
        prefix=prefix,
        digest=digest,
        classroom=classroom,
        created_by=created_by if getattr(created_by, "pk", None) else None,
        rate=rate,
    )
    return row, key


def key_revoke(row: ApiKey) -> None:
    """Refuse ``row`` from the next request on (kept, so its records still name it)."""
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])


def key_presented(authorization: str | None) -> KeyPresented:
    """The key in an ``Authorization: Bearer`` header; 401 ``missing_api_key`` without one,
    ``invalid_api_key`` for one that cannot be a key of this site."""
    if not authorization:
        raise Rejected(errors.API_KEY_MISSING)
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Rejected(errors.API_KEY_MISSING)
    prefix = token[len(KEY_START) : len(KEY_START) + PREFIX_LENGTH]
    if not token.startswith(KEY_START) or len(token) > 200 or len(prefix) != PREFIX_LENGTH:
        raise Rejected(errors.API_KEY_INVALID)
    return KeyPresented(prefix=prefix, digest=key_digest(token))


#: This process's last read of each key, by prefix.
_known: dict[str, KeyContext] = {}


def key_guess(presented: KeyPresented) -> tuple[bool, ClassContext | None]:
    """From the key alone, no I/O: (True, its class) when this process read it before and it
    matched; (False, None) when unknown here: start nothing before it is read."""
    known = _known.get(presented.prefix)
    if known is None or not hmac.compare_digest(known.digest, presented.digest):
        return False, None
    return True, known.classroom


def key_read(presented: KeyPresented) -> tuple[KeyContext, int | None]:
    """Synchronous (ORM, one query): the key's row and class now, and its own rate (None: the
    site's); 401 ``invalid_api_key`` for a key that is unknown, revoked or wrong, 403
    ``class_paused`` for a paused class."""
    # One query: the key with its class (its context is what the answer needs of it).
    row = ApiKey.objects.select_related("classroom").filter(prefix=presented.prefix).first()
    if (
        row is None
        or not hmac.compare_digest(row.digest, presented.digest)
        or row.revoked_at is not None
    ):
        # Unknown, wrong, revoked or deleted (with its class): no early start on it again.
        _known.pop(presented.prefix, None)
        raise Rejected(errors.API_KEY_INVALID)
    classroom = class_context_known(row.classroom) if row.classroom is not None else None
    context = KeyContext(id=row.id, digest=row.digest, classroom=classroom)
    if classroom is not None and classroom.paused:
        _known.pop(presented.prefix, None)
        class_paused_check(classroom)
    _known[presented.prefix] = context
    return context, row.rate


def key_admitted(presented: KeyPresented, request_id: str) -> tuple[Identity, SlotTry, list[Any]]:
    """Synchronous (ORM and cache): who asks with ``presented`` (``key_read``), if the key's
    rate allows another request (else 429 ``rate_limited``). A key's answers take no stream
    slot: a key serves many clients at once, bounded by its rate and the engine's seats."""
    context, rate = key_read(presented)
    limit = rate if rate is not None else settings.CHATSITE_API["RATE"]
    retry_after = rate_limit_hit(scope="api", key=str(context.id), limit=limit, window_s=60)
    if retry_after is not None:
        # Over its rate, a key's next request is read before any engine starts: a client
        # retrying its 429s costs a database read each, never a prompt's evaluation.
        _known.pop(presented.prefix, None)
        raise Rejected(errors.RATE_LIMITED, retry_after=retry_after)
    identity = Identity(owner_key=context.owner_key, classroom=context.classroom)
    return identity, SlotTry(taken=True), []


def key_owner(presented: KeyPresented) -> Identity:
    """Synchronous (ORM): whose a refused request was, for its record (the empty owner when
    the key is not valid)."""
    try:
        context, _rate = key_read(presented)
    except Rejected:
        return Identity(owner_key="")
    return Identity(owner_key=context.owner_key, classroom=context.classroom)
