"""Conversations deleted while an answer of theirs was being written: the cache's marks
(``conversations.conversation_delete`` sets one), and the group writer's way around them.

A message of a deleted conversation is refused by its foreign key, so the writer
(``persistence.GroupWriter``) looks for the marks only after the database refused a batch, not
before every batch: a delete during an answer is rare, a batch is not.
"""

import logging
import uuid
from typing import TYPE_CHECKING

from django.core.cache import cache

from assistant.db import run_db
from assistant.services.admission import cache_in_process

if TYPE_CHECKING:
    from assistant.services.persistence import Rows

logger = logging.getLogger(__name__)


def deleted_key(conversation_id: uuid.UUID) -> str:
    """The cache key marking a conversation deleted (``conversations.conversation_delete``)."""
    return f"conversation:deleted:{conversation_id}"


def deleted_marked(ids: set[uuid.UUID]) -> set[uuid.UUID]:
    """Synchronous (cache): which of ``ids`` are marked deleted, in one round trip; none when
    the cache cannot say (the database's refusal is the last word then)."""
    try:
        found = cache.get_many([deleted_key(i) for i in ids])
    except Exception:
        shown = ", ".join(sorted(map(str, ids)))
        logger.warning("Could not tell whether conversations %s were deleted", shown)
        return set()
    return {i for i in ids if deleted_key(i) in found}


async def deleted_look(ids: set[uuid.UUID]) -> set[uuid.UUID]:
    """``deleted_marked`` from the event loop: in place when the cache is this process's
    memory, on a reader thread otherwise."""
    return deleted_marked(ids) if cache_in_process() else await run_db(deleted_marked, ids)


async def deleted_dropped(batch: "list[Rows]") -> bool:
    """After the database refused ``batch``: leave out the rows of its conversations deleted
    meanwhile (their messages and touch; their records stay), marking them ``dropped``, in one
    cache trip. Whether any were: the batch is then written again without them.

    A message of a deleted conversation is refused by its foreign key, so the writer looks for
    the marks only after a refusal, not before every batch: a delete during an answer is rare,
    a batch is not."""
    asking = [rows for rows in batch if rows.unless_deleted is not None and not rows.dropped]
    if not asking:
        return False
    deleted = await deleted_look({rows.unless_deleted for rows in asking})
    gone = [rows for rows in asking if rows.unless_deleted in deleted]
    for rows in gone:
        rows.messages, rows.touch, rows.replaced, rows.dropped = [], [], [], True
    return bool(gone)
