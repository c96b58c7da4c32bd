"""The streaming endpoint as a Channels consumer: parse, call the service, send each frame.

Two departures from a stock ``AsyncHttpConsumer``, both for latency and correctness:

* ``dispatch`` skips Channels' ``aclose_old_connections()``: that is a hop onto Django's one
  sync thread for every ASGI message, and under load the first token queued behind every other
  stream's hop. This consumer touches the database only through ``assistant.db.run_db``.
* The response runs as its own task while the consumer keeps receiving, so ``http.disconnect``
  arrives while the answer is streaming and cancels it at once (a stock ``handle()`` would only
  see it after finishing, and Daphne would kill it ~10 s later).
"""

import asyncio
import logging
from contextlib import aclosing
from typing import Any

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer
from django.conf import settings

from assistant import errors, http
from assistant.engines import EngineUnavailable, get_engine
from assistant.errors import Rejected
from assistant.services.chat_request import chat_turn_parse, request_id_choose
from assistant.services.streaming import (
    Heartbeat,
    chat_stream_frames,
    chat_stream_open,
    error_frame,
    ping_interval,
)
from assistant.services.telemetry import stream_refused
from assistant.services.timings import StreamTimings, now

logger = logging.getLogger(__name__)


def sse_headers(request_id: str, set_cookie: str | None) -> list[tuple[bytes, bytes]]:
    # No Content-Length (the body is open-ended), no Content-Encoding (compression buffers), and
    # no hand-set Transfer-Encoding: the server chooses chunking for HTTP/1.1 clients itself.
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache, no-transform"),
        (b"x-accel-buffering", b"no"),
        (b"x-content-type-options", b"nosniff"),
        (b"x-request-id", request_id.encode("ascii")),
    ]
    if set_cookie:
        headers.append((b"set-cookie", set_cookie.encode("latin-1")))
    return headers


class ChatStreamConsumer(AsyncHttpConsumer):
    """``POST /api/chat/stream``: answer one chat message as Server-Sent Events."""

    path_name = "direct"
    engine_alias = "default"
    # HTTP streams use no channel layer: skip creating a channel for each request.
    channel_layer_alias = "chatsite.no-channel-layer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timings = StreamTimings(received=now())
        self.body_size = 0
        self.response_task: asyncio.Task[None] | None = None
        self.response_started = False

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def http_request(self, message: dict[str, Any]) -> None:
        if self.response_task is not None:
            return
        chunk = message.get("body", b"")
        self.body_size += len(chunk)
        if self.body_size > settings.CHATSITE_STREAM["MAX_BODY_BYTES"]:
            self.response_task = asyncio.create_task(self.send_error(errors.BODY_TOO_LARGE))
            return
        self.body.append(chunk)
        if not message.get("more_body"):
            self.response_task = asyncio.create_task(self.respond(b"".join(self.body)))

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        # Sent by the server when the client goes away and also after a finished response.
        task = self.response_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        raise StopConsumer()

    async def send_error(
        self, error: errors.ApiError, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.response_started = True
        await self.send_response(
            error.status, error.body(), headers=http.json_response_headers(extra)
        )

    async def respond(self, body: bytes) -> None:
        try:
            await self.stream_or_reject(body)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Chat stream crashed")
            if not self.response_started:
                await self.send_error(errors.ENGINE_FAILED.with_message("The server failed."))
            else:
                frame = error_frame("server_error", "The server failed while answering.")
                await self.send_body(frame, more_body=False)

    async def stream_or_reject(self, body: bytes) -> None:
        scope = self.scope
        if scope["method"] != "POST":
            await self.send_error(errors.METHOD_NOT_ALLOWED, [(b"allow", b"POST")])
            return
        if not http.is_json(http.header(scope, b"content-type")):
            await self.send_error(errors.UNSUPPORTED_MEDIA_TYPE)
            return
        request = http.asgi_request(scope, body)
        rejected = http.request_error(request)
        if rejected is not None:
            await self.send_error(rejected)
            return
        request_id = request_id_choose(http.header(scope, b"x-request-id"))
        engine_name = self.engine_alias
        try:
            turn = chat_turn_parse(body)
            engine = get_engine(self.engine_alias)
            engine_name = engine.name
            engine.check()
            stream = await chat_stream_open(
                turn=turn,
                session_key=http.session_key(request),
                engine=engine,
                path=self.path_name,
                request_id=request_id,
                timings=self.timings,
            )
        except Rejected as rejected:
            await self.send_error(rejected.error)
            return
        except EngineUnavailable as exc:
            logger.warning("Engine unavailable: %s", exc)
            stream_refused(path=self.path_name, engine=engine_name, reason=exc.code)
            await self.send_error(errors.ENGINE_UNAVAILABLE)
            return

        self.response_started = True
        heartbeat = Heartbeat(self.send_frame, ping_interval())
        beating: asyncio.Task[None] | None = None
        try:
            headers = sse_headers(request_id, stream.identity.set_cookie)
            await self.send_headers(status=200, headers=headers)
            beating = asyncio.create_task(heartbeat.run())
            async with aclosing(chat_stream_frames(stream)) as frames:
                async for frame in frames:
                    await self.send_body(frame, more_body=True)
                    heartbeat.beat()
        finally:
            if beating is not None:
                beating.cancel()
            await stream.aclose()
        await self.send_body(b"", more_body=False)

    async def send_frame(self, frame: bytes) -> None:
        await self.send_body(frame, more_body=True)
