"""An answer whose conversation was deleted while it ran is left out by the writer, which looks
for the cache's deleted marks once per batch (``persistence.deleted_dropped``), not once per
answer. The end-to-end case, through a real server and both serving paths, is
tests/assistant/test_conversation_actions.py: test_deleting_a_conversation_while_its_answer_streams.
"""

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import BaseCache, cache, caches

from assistant.models import Conversation, Message
from assistant.services import conversations, persistence
from assistant.services.conversations import DELETED_KEEP_S
from assistant.services.persistence import Rows, deleted_key, rows_write

pytestmark = pytest.mark.django_db


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
        messages=[Message(conversation=conversation, role="assistant", content=text)],
        touch=[conversation.id],
    )
    rows.unless_deleted = conversation.id
    return rows


def test_a_batch_leaves_out_the_answers_of_conversations_marked_deleted(
    marks: list[uuid.UUID],
) -> None:
    kept = Conversation.objects.create(owner_key="owner", title="kept")
    gone = Conversation.objects.create(owner_key="owner", title="gone")
    mark(marks, gone.id)
    rows_kept, rows_gone = answer(kept, "stays"), answer(gone, "does not")
    lookups: list[list[str]] = []
    get_many = cache.get_many

    def counted(keys: list[str]) -> dict[str, Any]:
        lookups.append(keys)
        return get_many(keys)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(persistence.cache, "get_many", counted)
        rows_write([rows_kept, rows_gone])
    assert len(lookups) == 1 and len(lookups[0]) == 2  # one look for the whole batch
    assert not rows_kept.dropped and rows_gone.dropped
    assert list(Message.objects.values_list("content", flat=True)) == ["stays"]


def test_rows_not_asking_to_be_left_out_cost_no_look() -> None:
    conversation = Conversation.objects.create(owner_key="owner", title="kept")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(persistence.cache, "get_many", lambda keys: pytest.fail("looked"))
        rows_write([Rows(messages=[Message(conversation=conversation, role="user", content="q")])])
    assert Message.objects.count() == 1


def test_a_cache_that_cannot_say_drops_nothing(
    marks: list[uuid.UUID], caplog: pytest.LogCaptureFixture
) -> None:
    conversation = Conversation.objects.create(owner_key="owner", title="kept")
    rows = answer(conversation, "stays")

    def unreachable(keys: list[str]) -> dict[str, Any]:
        raise ConnectionError("cache down")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(persistence.cache, "get_many", unreachable)
        rows_write([rows])
    assert not rows.dropped and Message.objects.count() == 1
    assert f"Could not tell whether conversations {conversation.id} were deleted" in caplog.text


def test_a_mark_of_another_conversation_drops_nothing(marks: list[uuid.UUID]) -> None:
    conversation = Conversation.objects.create(owner_key="owner", title="kept")
    mark(marks, uuid.uuid4())
    rows = answer(conversation, "stays")
    rows_write([rows])
    assert not rows.dropped and Message.objects.count() == 1


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
