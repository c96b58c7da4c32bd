"""Starting an answer for the OpenAI-compatible API: the page's runner, asked with a key.

The same service as the page (``services/answer_open.py``): the same seats, engines, split,
breaker, recording and metrics, with the serving path ``api``. What differs is who asks (a key,
``services/api_keys.py``, whose answers are its class's and are limited by its rate), what the
engine is given (the request's messages and sampling within the class's, ``CompletionRequest``)
and the wire format (``services/openai_wire.py``).

The split places each key where it places a student: the same share of keys is answered by
the candidate path's engine, and a tripped breaker sends them all back to the baseline's.
"""

import functools

from assistant.db import run_db
from assistant.services.answer import Answer
from assistant.services.answer_open import Admitted, Asking, answer_begin, request_id_check
from assistant.services.api_keys import (
    OWNER_PREFIX,
    KeyPresented,
    key_admitted,
    key_guess,
    key_owner,
    key_read,
)
from assistant.services.openai_request import CompletionRequest
from assistant.services.openai_wire import OpenAIFrames
from assistant.services.serving_refresh import split_current
from assistant.services.serving_state import API_PATH, engine_alias_for
from assistant.services.timings import StreamTimings


async def api_answer_start(
    *,
    request: CompletionRequest,
    presented: KeyPresented,
    client: str,
    request_id: str,
    timings: StreamTimings,
) -> Answer:
    """Start answering ``request`` for the key ``presented``. Raises ``Rejected`` as the page's
    ``answer_start`` does, and 401 for a key that is not valid."""
    request_id_check(request_id)
    known, guess = key_guess(presented)
    if not known:
        # A key this process does not know (new, refused last time, over its rate) is read
        # before anything else: a made-up one is 401 before the engine is checked (no 503, no
        # record, nothing learnt of the engine), and no engine starts before it is admitted.
        context, _rate = await run_db(key_read, presented)
        guess = context.classroom
    request.class_check(guess)
    split = await split_current()
    path = split.route(f"{OWNER_PREFIX}{presented.prefix}")
    asking = Asking(
        question=request.question,
        conversation_id=None,
        replaces=None,
        held=None,
        admit=functools.partial(_admitted, presented, request_id, request),
        prompt=request.prompt,
        owner=functools.partial(key_owner, presented),
        sampling=request.sampling,
        frames=OpenAIFrames(
            completion_id=f"chatcmpl-{request_id}",
            model=request.model,
            include_usage=request.include_usage,
        ),
        holds_slot=False,
        resumable=False,
    )
    return await answer_begin(
        asking,
        path_alias=engine_alias_for(path),
        guess=guess,
        guess_known=known,
        client=client,
        request_id=request_id,
        serving_path=API_PATH,
        timings=timings,
    )


def _admitted(presented: KeyPresented, request_id: str, request: CompletionRequest) -> Admitted:
    """Synchronous: the key's asker (``key_admitted``), if the request fits the key's class."""
    admitted = key_admitted(presented, request_id)
    request.class_check(admitted[0].classroom)
    return admitted
