"""An answer whose conversation was deleted while it ran is left out by the writer: the database
refuses its message (the conversation is gone), and only then does the writer look for the
cache's deleted marks, once for the refused batch (``deleted_marks.deleted_dropped``), and write
the rest again. The end-to-end case, through a real server and both serving paths, is
tests/assistant/test_conversation_actions.py: test_deleting_a_conversation_while_its_answer_streams.
"""

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from django.core.cache import BaseCache, cache, caches

from assistant.db import run_db
from assistant.models import Conversation, Message
from assistant.services import conversations
from assistant.services.conversations import DELETED_KEEP_S
from assistant.services.deleted_marks import deleted_key
from assistant.services.persistence import PersistenceFailed, Rows, rows_store, rows_writing
from tests.support import row_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def marks() -> Iterator[list[uuid.UUID]]:
    """The conversations a test marks deleted; their marks are deleted after (only theirs: the
    cache may be the machine's Redis, shared with running workers)."""
    marked: list[uuid.UUID] = []
    yield marked
    cache.delete_many([deleted_key(i) for i in marked])


def mark(marks: list[uuid.UUID], conversation_id: uuid.UUID) -> None:
    marks.append(conversation_id)
    cache.set(deleted_key(conversation_id), True, timeout=DELETED_KEEP_S)


def answer(conversation: Conversation, text: str) -> Rows:
    rows = Rows(
        messages=[row_of(Message(conversation=conversation, role="assistant", content=text))],
        touch=[conversation.id],
    )
    rows.unless_deleted = conversation.id
    return rows


def contents() -> list[str]:
    return list(Message.objects.values_list("content", flat=True))


def counted_looks(patch: pytest.MonkeyPatch) -> list[list[str]]:
    """The keys of every look for deleted marks from now on, on every thread's cache object."""
    looks: list[list[str]] = []
    get_many = type(caches["default"]).get_many

    def counted(self: BaseCache, keys: list[str], version: int | None = None) -> dict:
        looks.append(list(keys))
        return get_many(self, keys, version=version)

    patch.setattr(type(caches["default"]), "get_many", counted)
    return looks


async def test_a_refused_batch_leaves_out_the_answers_of_conversations_marked_deleted(
    marks: list[uuid.UUID], caplog: pytest.LogCaptureFixture
) -> None:
    """Two answers in one batch, one of a conversation deleted (and marked) since: the database
    refuses the batch, the writer looks once for both, and writes the other again, alone."""
    kept = await run_db(Conversation.objects.create, owner_key="owner", title="kept")
    gone = await run_db(Conversation.objects.create, owner_key="owner", title="gone")
    rows_kept, rows_gone = answer(kept, "stays"), answer(gone, "does not")
    gone_id = gone.id
    await run_db(gone.delete)  # (its id is None from here)
    mark(marks, gone_id)
    with pytest.MonkeyPatch.context() as patch:
        looks = counted_looks(patch)
        await asyncio.gather(rows_store(rows_kept), rows_store(rows_gone))  # one batch
    assert [sorted(keys) for keys in looks] == [sorted(map(deleted_key, (kept.id, gone_id)))]
    assert not rows_kept.dropped and rows_gone.dropped
    assert await run_db(contents) == ["stays"]
    assert "Could not store" not in caplog.text
    # Neither is waited for any more (a follow-up's history read), the dropped one included.
    assert not rows_writing(kept.id) and not rows_writing(gone_id)


async def test_a_batch_the_database_takes_costs_no_look(marks: list[uuid.UUID]) -> None:
    """The marks are looked for only after a refusal: an answer whose conversation is there,
    even one marked deleted by mistake, is stored without a cache trip."""
    conversation = await run_db(Conversation.objects.create, owner_key="owner", title="kept")
    mark(marks, conversation.id)
    rows = answer(conversation, "stays")
    with pytest.MonkeyPatch.context() as patch:
        looks = counted_looks(patch)
        await rows_store(rows)
    assert looks == [] and not rows.dropped
    assert await run_db(Message.objects.count) == 1


async def test_a_cache_that_cannot_say_drops_nothing(
    marks: list[uuid.UUID], caplog: pytest.LogCaptureFixture
) -> None:
    """Deleted, but the cache cannot say so: the refusal is the last word (one warning for the
    look, one for the rows), and the rows' writer says they failed."""
    conversation = await run_db(Conversation.objects.create, owner_key="owner", title="gone")
    rows, gone_id = answer(conversation, "refused"), conversation.id
    await run_db(conversation.delete)

    def unreachable(self: BaseCache, keys: list[str], version: int | None = None) -> dict:
        raise ConnectionError("cache down")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(caches["default"]), "get_many", unreachable)
        with pytest.raises(PersistenceFailed):
            await rows_store(rows)
    assert not rows.dropped and await run_db(Message.objects.count) == 0
    assert f"Could not tell whether conversations {gone_id} were deleted" in caplog.text
    assert "Could not store rows" in caplog.text


async def test_a_mark_of_another_conversation_drops_nothing(marks: list[uuid.UUID]) -> None:
    """Refused, and only another conversation is marked: nothing is left out, the rows fail."""
    conversation = await run_db(Conversation.objects.create, owner_key="owner", title="gone")
    rows = answer(conversation, "refused")
    await run_db(conversation.delete)
    mark(marks, uuid.uuid4())
    with pytest.raises(PersistenceFailed):
        await rows_store(rows)
    assert not rows.dropped and await run_db(Message.objects.count) == 0


async def test_the_look_after_a_refused_write_reads_the_same_marks(
    marks: list[uuid.UUID], caplog: pytest.LogCaptureFixture
) -> None:
    """``answer_store``'s look for one conversation, after the writer refused its rows, is the
    batch's look (``deleted_marked``) for one id: marked, not marked, and a cache that cannot
    say (not deleted, with the same warning)."""
    gone, kept = uuid.uuid4(), uuid.uuid4()
    mark(marks, gone)
    assert await conversations._conversation_deleted(gone)
    assert not await conversations._conversation_deleted(kept)

    def unreachable(self: BaseCache, keys: list[str], version: int | None = None) -> dict:
        raise ConnectionError("cache down")

    with pytest.MonkeyPatch.context() as patch:  # every thread's cache object: the class's
        patch.setattr(type(caches["default"]), "get_many", unreachable)
        assert not await conversations._conversation_deleted(gone)
    assert f"Could not tell whether conversations {gone} were deleted" in caplog.text
