"""The ``direct`` serving path: a Channels consumer that runs the answer in its own task.

Parse, start an answer (``services/answer_start.py``), then ``Answer.run`` with this response as
its live listener: each frame goes from the engine to the socket in this one task. Three
departures from a stock ``AsyncHttpConsumer``, for latency, CPU and correctness:

* ``__call__`` receives each message and dispatches it in the consumer's own task. Channels'
  runs every ``receive`` in a task of its own and waits for it with ``asyncio.wait`` (made for
  a consumer that reads a channel layer too), and looks up a channel layer for every request:
  three tasks, two waits and a settings lookup per request, for the one source of messages an
  HTTP stream has.
* ``dispatch`` skips Channels' ``aclose_old_connections()``: that is a hop onto Django's one
  sync thread for every ASGI message, and under load the first token queued behind every other
  stream's hop. This consumer touches the database only through ``assistant.db.run_db``.
* The response runs as its own task while the consumer keeps receiving, so ``http.disconnect``
  arrives while the answer is streaming and detaches it at once (a stock ``handle()`` would only
  see it after finishing, and Daphne would kill it ~10 s later).
"""

import asyncio
import logging
from typing import Any

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer

from assistant import conf, csrf, errors, http, internals
from assistant.errors import Rejected
from assistant.scope_headers import scope_cookies
from assistant.services.answer import Answer
from assistant.services.answer_start import answer_start
from assistant.services.chat_request import request_id_choose
from assistant.services.clients import scope_client
from assistant.services.frames import SITE_FRAMES
from assistant.services.timings import StreamTimings, received_at
from assistant.transport import scope_connection

logger = logging.getLogger(__name__)


class ChatStreamConsumer(AsyncHttpConsumer):
    """``POST /api/chat/stream/direct``: answer one chat message as Server-Sent Events."""

    serving_path = "direct"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timings = StreamTimings(received=0.0)
        self.body_size = 0
        self.body_chunks: list[bytes] = []
        self.response_task: asyncio.Task[None] | None = None
        self.response_started = False
        self.answer: Answer | None = None
        #: The stream's status line and headers, sent with its first frame.
        self.stream_headers: list[tuple[bytes, bytes]] | None = None
        #: The client is gone: nothing more is sent.
        self.disconnected = False
        #: The response's body has ended (with the answer's last frame).
        self.body_ended = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Channels' ``AsyncConsumer.__call__`` for a consumer without a channel layer: each
        message is received, then dispatched, in this task, until a handler raises
        ``StopConsumer``."""
        self.timings.received = received_at(scope)
        self.scope, self.base_send = scope, send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass
        finally:
            # Cancelled by the server shutting down: stop the answer here, so that it is stored
            # (the engine stops, what was said is saved) before the process exits.
            task = self.response_task
            if task is not None and not task.done() and not self.disconnected:
                task.cancel()
                await asyncio.wait({task})

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = internals.consumer_handler(self, message)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def http_request(self, message: dict[str, Any]) -> None:
        if self.response_task is not None:
            return
        chunk = message.get("body", b"")
        self.body_size += len(chunk)
        if self.body_size > self.body_limit():
            self.response_task = asyncio.create_task(self.send_error(errors.BODY_TOO_LARGE))
            return
        self.body_chunks.append(chunk)
        if not message.get("more_body"):
            self.response_task = asyncio.create_task(self.respond(b"".join(self.body_chunks)))

    async def http_disconnect(self, message: dict[str, Any]) -> None:
        # Sent by the server when the client goes away and also after a finished response.
        self.disconnected = True
        task = self.response_task
        if task is not None and not task.done():
            answer = self.answer
            if answer is not None and not answer.finished:
                self.client_gone(answer)
            else:
                task.cancel()
                await asyncio.wait({task})
        raise StopConsumer()

    def body_limit(self) -> int:
        return conf.settings.CHATSITE_STREAM["MAX_BODY_BYTES"]

    def client_gone(self, answer: Answer) -> None:
        """The client left mid-answer: it goes on for the resume grace, in this task."""
        answer.detach()

    async def send_error(
        self, error: errors.ApiError, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.response_started = True
        await http.send_error(self.send, self.scope, error, extra)

    async def respond(self, body: bytes) -> None:
        try:
            await self.answer_or_refuse(body)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Chat stream crashed")
            await self.crashed()

    async def crashed(self) -> None:
        """Tell the client the server failed: an error response, or the stream's last frame."""
        if not self.response_started:
            await self.send_error(errors.SERVER_FAILED)
        elif not self.disconnected and not self.body_ended:
            await self.send_body(SITE_FRAMES.server_error(), more_body=False)

    async def answer_or_refuse(self, body: bytes) -> None:
        # Method, content type and host were checked by the router (assistant.routing).
        scope = self.scope
        rejected = csrf.csrf_refusal(scope, body)
        if rejected is not None:
            await self.send_error(rejected)
            return
        request_id = request_id_choose(http.header(scope, b"x-request-id"))
        cookies = scope_cookies(scope)
        try:
            answer = await answer_start(
                body=body,
                session_key=http.session_key(cookies),
                class_hint=http.class_hint(cookies),
                client=scope_client(scope),
                request_id=request_id,
                serving_path=self.serving_path,
                timings=self.timings,
            )
        except Rejected as rejected:
            await self.send_error(rejected.error, rejected.headers())
            return
        self.response_started = True
        self.answer = answer
        self.stream_headers = [*http.sse_headers(request_id), *http.security_headers(scope)]
        await self.stream(answer)

    async def stream(self, answer: Answer) -> None:
        """Run ``answer`` with this response as its live listener, to the end of the body: the
        last frame ends it, in the same write (an answer without one ends it empty)."""
        await answer.run(
            live=self.send_frame, end=self.send_last, connection=scope_connection(self.scope)
        )
        if not self.disconnected and not self.body_ended:
            await self.send_body(b"", more_body=False)

    async def send_frame(self, frame: bytes, *, more_body: bool = True) -> None:
        """The answer's live listener: the status and headers go with its first frame. Each
        frame goes straight to the server's ``send``: Channels' ``send_body`` and ``send``
        would add two coroutines to every token and nothing else."""
        if self.stream_headers is not None:
            headers, self.stream_headers = self.stream_headers, None
            await self.send_headers(status=200, headers=headers)
        await self.base_send({"type": "http.response.body", "body": frame, "more_body": more_body})

    async def send_last(self, frame: bytes) -> None:
        """The answer's last frame, which ends the body (one write for both); nothing once the
        client is gone."""
        if self.disconnected:
            return
        self.body_ended = True
        await self.send_frame(frame, more_body=False)
