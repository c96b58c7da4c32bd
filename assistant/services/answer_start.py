"""Starting an answer for the students' page: shared by the Channels consumer and the Django view.

Both paths hand over the raw body, the session cookie and the client's address and get back a
started ``Answer`` (``services/answer.py``) or a ``Rejected`` carrying the exact error to answer
with, so they can differ only in transport. The order of work (the engine first for a new
conversation, the session read beside it) is ``services/answer_open.py``'s, shared with the API.
"""

import functools
import uuid
from collections.abc import Sequence

from django.conf import settings

from assistant import errors
from assistant.engines import ChatMessage
from assistant.errors import Rejected
from assistant.services.admission import SlotTry, cache_in_process, chat_admit, chat_release
from assistant.services.answer import Answer
from assistant.services.answer_open import Admitted, Asking, answer_begin, request_id_check
from assistant.services.chat_request import ChatTurn, ClassShown, chat_turn_parse
from assistant.services.class_versions import class_version
from assistant.services.classrooms import (
    ClassContext,
    chat_rate_for,
    class_guess,
    class_paused_check,
    class_shown_check,
    system_prompt,
)
from assistant.services.conversations import conversation_history, history_held
from assistant.services.identity import (
    Identity,
    identity_in_memory,
    identity_required,
    identity_resolve,
)
from assistant.services.loop_admission import page_admission_on_loop
from assistant.services.serving_state import engine_alias_for
from assistant.services.table_rows import Row
from assistant.services.timings import StreamTimings


async def answer_start(
    *,
    body: bytes,
    session_key: str | None,
    class_hint: str | None,
    client: str,
    request_id: str,
    serving_path: str,
    timings: StreamTimings,
) -> Answer:
    """Validate ``body``, start ``serving_path``'s engine on it and resolve who is asking.

    A request without a session cookie is refused at once (403 ``session_required``): the
    page issues sessions, a limited number per address (``identity.session_issue``).

    ``class_hint`` (the class cookie) is the guess of the student's class that a new
    conversation's engine starts on before the session is read (``services/classrooms.py``).

    Raises ``Rejected`` for a request the client can fix (4xx) and for an engine that cannot
    take it now (503, counted and recorded like any failed stream).
    """
    known, guess = class_guess(class_hint)
    if session_key is None:
        raise Rejected(errors.SESSION_REQUIRED)
    request_id_check(request_id)
    turn = chat_turn_parse(body)
    held = history_held(turn.conversation_id, turn.replaces)
    asking = Asking(
        question=turn.message,
        conversation_id=turn.conversation_id,
        replaces=turn.replaces,
        held=held,
        admit=functools.partial(_page_admitted, session_key, turn, request_id, held=held or ()),
        admit_now=functools.partial(_page_admitted_now, session_key, turn, request_id),
        admit_on_loop=functools.partial(
            page_admission_on_loop,
            session_key,
            turn.conversation_id,
            turn.replaces,
            turn.shown,
            request_id,
            held=held or (),
        ),
        prompt=functools.partial(_messages, turn.message),
        owner=functools.partial(identity_resolve, session_key),
    )
    return await answer_begin(
        asking,
        path_alias=engine_alias_for(serving_path),
        guess=guess,
        guess_known=known,
        client=client,
        request_id=request_id,
        serving_path=serving_path,
        timings=timings,
    )


def _page_admitted(
    session_key: str | None, turn: ChatTurn, request_id: str, *, held: Sequence[Row] = ()
) -> Admitted:
    """The page's asker: their identity and slot (and history, continuing a conversation,
    completed with ``held``: ``conversations.history_held``)."""
    if turn.conversation_id is not None:
        return _identity_and_history(session_key, turn, request_id, held)
    identity, slot = _identity_admitted(session_key, request_id, turn.shown)
    return identity, slot, []


def _page_admitted_now(session_key: str, turn: ChatTurn, request_id: str) -> Admitted | None:
    """``_page_admitted`` on the event loop, where nothing it reads needs I/O: a new
    conversation, the session known from memory (``identity_in_memory``) and the rate and
    stream slots counted in this process's memory. None: admit on a database thread."""
    if turn.conversation_id is not None or not cache_in_process():
        return None
    identity = identity_in_memory(session_key)
    if identity is None:
        return None
    return identity, _admitted(identity, request_id, turn.shown), []


def _messages(
    question: str, history: list[ChatMessage], classroom: ClassContext | None
) -> list[ChatMessage]:
    system = system_prompt(classroom)
    head = [ChatMessage(role="system", content=system)] if system else []
    return [*head, *history, ChatMessage(role="user", content=question)]


def _identity_admitted(
    session_key: str | None, request_id: str, shown: ClassShown
) -> tuple[Identity, SlotTry]:
    """Who is asking (``Rejected``, 403, without a session), whether their class is open (403
    ``class_paused``) and the one their page showed (409 ``class_changed``), if their rate
    allows another stream (else ``Rejected``, 429), and what the try for a stream slot found."""
    identity = identity_required(session_key)
    return identity, _admitted(identity, request_id, shown)


def _admitted(identity: Identity, request_id: str, shown: ClassShown) -> SlotTry:
    """Whether ``identity``'s class is open and the one their page showed, and their rate and
    stream slot (``_identity_admitted``)."""
    class_paused_check(identity.classroom)
    class_shown_check(shown, identity.classroom)
    return chat_admit(
        owner_key=identity.owner_key,
        request_id=request_id,
        rate=chat_rate_for(identity.classroom),
        class_version=class_version(identity.classroom, check=False),
    )


def _identity_and_history(
    session_key: str | None, turn: ChatTurn, request_id: str, held: Sequence[Row]
) -> Admitted:
    assert turn.conversation_id is not None
    identity, slot = _identity_admitted(session_key, request_id, turn.shown)
    try:
        history = _history(identity, turn.conversation_id, before=turn.replaces, held=held)
    except BaseException:
        chat_release(owner_key=identity.owner_key, request_id=request_id)
        raise
    return identity, slot, history


def _history(
    identity: Identity,
    conversation_id: uuid.UUID,
    *,
    before: uuid.UUID | None,
    held: Sequence[Row],
) -> list[ChatMessage]:
    return conversation_history(
        owner_key=identity.owner_key,
        classroom_id=identity.classroom_id,
        conversation_id=conversation_id,
        limit=settings.CHATSITE_STREAM["HISTORY_MESSAGES"],
        before=before,
        held=held,
    )
