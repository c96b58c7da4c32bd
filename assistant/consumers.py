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
from assistant.errors import Rejected
from assistant.services import background
from assistant.services.chat_request import request_id_choose
from assistant.services.clients import scope_client
from assistant.services.frames import Heartbeat, ping_interval, server_error_frame
from assistant.services.resume import ResumableStream, resumable_open
from assistant.services.stream_start import chat_stream_start
from assistant.services.streaming import ChatStream, chat_stream_body
from assistant.services.timings import StreamTimings, received_at
from assistant.transport import scope_connection

logger = logging.getLogger(__name__)


class ChatStreamConsumer(AsyncHttpConsumer):
    """``POST /api/chat/stream/direct``: answer one chat message as Server-Sent Events."""

    path_name = "direct"
    # HTTP streams use no channel layer: skip creating a channel for each request.
    channel_layer_alias = "chatsite.no-channel-layer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timings = StreamTimings(received=0.0)
        self.body_size = 0
        self.response_task: asyncio.Task[None] | None = None
        self.response_started = False
        #: The answer's frames, kept for a resume after a network drop.
        self.resumable: ResumableStream | None = None
        self.stream: ChatStream | None = None
        #: The client is gone; the answer goes on into ``resumable`` only.
        self.detached = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.timings.received = received_at(scope)
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Cancelled by the server shutting down: stop the answer here, so that its finally
            # blocks run (the engine stops, what was said is stored) before the process exits.
            task = self.response_task
            if task is not None and not task.done() and not self.detached:
                task.cancel()
                await asyncio.wait({task})

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
            resumable = self.resumable
            if resumable is not None and not resumable.finished:
                # The answer goes on for the grace period (none: it stops at once), for the page
                # to resume it; the connection is gone, so nothing reads its buffers any more.
                self.detached = True
                if self.stream is not None:
                    self.stream.connection = None
                background.adopt(task)
                resumable.detach()
            else:
                task.cancel()
                await asyncio.wait({task})
        raise StopConsumer()

    def stop_answer(self) -> None:
        """Stop generating (the partial answer is saved): nobody resumed in time, another
        student waits for the engine, or the student pressed Stop. A response still connected
        is ended, so a client that keeps reading sees the stream close."""
        task = self.response_task
        if task is None or task.done():
            return
        task.cancel()
        if not self.detached:
            background.spawn(self._end_after(task), name="stopped-response")

    async def _end_after(self, task: asyncio.Task[None]) -> None:
        await asyncio.wait({task})
        if not self.detached:
            self.detached = True
            await self.send_body(b"", more_body=False)

    async def send_error(
        self, error: errors.ApiError, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.response_started = True
        http.refusal(error)
        await self.send_response(
            error.status, error.body(), headers=http.json_response_headers(self.scope, extra)
        )

    async def respond(self, body: bytes) -> None:
        try:
            await self.stream_or_reject(body)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Chat stream crashed")
            if not self.response_started:
                await self.send_error(errors.SERVER_FAILED)
            else:
                await self.send_body(server_error_frame(), more_body=False)

    async def stream_or_reject(self, body: bytes) -> None:
        # Method, content type and host were checked by the router (assistant.routing).
        scope = self.scope
        request = http.asgi_request(scope, body)
        rejected = http.csrf_error(request)
        if rejected is not None:
            await self.send_error(rejected)
            return
        request_id = request_id_choose(http.header(scope, b"x-request-id"))
        try:
            stream = await chat_stream_start(
                body=body,
                session_key=http.session_key(request),
                client=scope_client(scope),
                request_id=request_id,
                path=self.path_name,
                timings=self.timings,
                connection=scope_connection(scope),
            )
        except Rejected as rejected:
            await self.send_error(rejected.error, rejected.headers())
            return

        self.response_started = True
        self.stream = stream
        resumable = self.resumable = resumable_open(
            request_id=request_id,
            owner_key=stream.identity.owner_key,
            stop=self.stop_answer,
            contended=stream.engine.contended,
        )
        resumable.attach()  # this response is its first listener
        stream.heard_by(resumable)
        heartbeat = Heartbeat(self.send_frame, ping_interval())
        beating: asyncio.Task[None] | None = None
        try:
            await self.send_headers(
                status=200, headers=[*http.sse_headers(request_id), *http.security_headers(scope)]
            )
            beating = asyncio.create_task(heartbeat.run())
            async with aclosing(chat_stream_body(stream)) as frames:
                async for frame in frames:
                    resumable.append(frame)
                    if not self.detached:
                        await self.send_body(frame, more_body=True)
                        heartbeat.beat()
        finally:
            if beating is not None:
                beating.cancel()
            try:
                await stream.aclose()
            finally:
                resumable.finish()
        if not self.detached:
            await self.send_body(b"", more_body=False)

    async def send_frame(self, frame: bytes) -> None:
        if not self.detached:
            await self.send_body(frame, more_body=True)
