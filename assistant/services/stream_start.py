"""Starting a chat stream on a serving path: shared by the Channels consumer and the Django view.

Both paths hand over the raw body and the session cookie and get back a running ``ChatStream``
or a ``Rejected`` carrying the exact error to answer with, so they can differ only in transport.
"""

import logging

from django.db import InterfaceError, OperationalError

from assistant import errors
from assistant.db import run_db
from assistant.engines import EngineBusy, EngineUnavailable, get_engine
from assistant.errors import Rejected
from assistant.services import background
from assistant.services.chat_request import chat_turn_parse
from assistant.services.identity import identity_resolve
from assistant.services.persistence import Rows, rows_store
from assistant.services.serving import engine_alias_for
from assistant.services.streaming import ChatStream, chat_stream_open
from assistant.services.telemetry import refused_record, stream_refused
from assistant.services.timings import StreamTimings
from assistant.transport import ClientConnection

logger = logging.getLogger(__name__)

#: What a refused request is told to wait: a full engine frees up fast, a broken one does not.
BUSY_RETRY_AFTER_S = 2
UNAVAILABLE_RETRY_AFTER_S = 10
DATABASE_RETRY_AFTER_S = 5


async def chat_stream_start(
    *,
    body: bytes,
    session_key: str | None,
    request_id: str,
    path: str,
    timings: StreamTimings,
    connection: ClientConnection | None,
) -> ChatStream:
    """Validate ``body``, start ``path``'s engine on it and resolve who is asking.

    Raises ``Rejected`` for a request the client can fix (4xx) and for an engine that cannot
    take it now (503, counted and recorded like any failed stream).
    """
    alias = engine_alias_for(path)
    engine_name = alias
    try:
        turn = chat_turn_parse(body)
        engine = get_engine(alias)
        engine_name = engine.name
        engine.check()
        return await chat_stream_open(
            turn=turn,
            session_key=session_key,
            engine=engine,
            path=path,
            request_id=request_id,
            timings=timings,
            connection=connection,
        )
    except (OperationalError, InterfaceError) as exc:
        logger.error("Database unavailable before %s started: %s", request_id, exc)
        raise Rejected(errors.DATABASE_UNAVAILABLE, retry_after=DATABASE_RETRY_AFTER_S) from None
    except EngineUnavailable as exc:
        logger.warning("Engine %r unavailable for %s: %s", alias, request_id, exc)
        stream_refused(path=path, engine=engine_name, reason=exc.code)
        background.spawn(
            _refused_persist(
                session_key=session_key,
                request_id=request_id,
                path=path,
                engine=engine_name,
                reason=exc.code,
                timings=timings,
            ),
            name=f"refused:{request_id}",
        )
        if isinstance(exc, EngineBusy):
            raise Rejected(errors.ENGINE_BUSY, retry_after=BUSY_RETRY_AFTER_S) from None
        raise Rejected(errors.ENGINE_UNAVAILABLE, retry_after=UNAVAILABLE_RETRY_AFTER_S) from None


async def _refused_persist(
    *,
    session_key: str | None,
    request_id: str,
    path: str,
    engine: str,
    reason: str,
    timings: StreamTimings,
) -> None:
    """A refused stream is a failed one: stored, so the breaker and the dashboard count it."""
    identity = await run_db(identity_resolve, session_key, create=False)
    record = refused_record(
        request_id=request_id,
        owner_key=identity.owner_key,
        path=path,
        engine=engine,
        reason=reason,
        timings=timings,
    )
    await rows_store(Rows(records=[record]))
