"""The OpenAI-compatible API's ASGI entry: ``POST /v1/chat/completions`` and ``GET /v1/models``.

Parse, authenticate, call the service (``services/api_answer.py``), send. Answers are streamed by
the same consumer as the page's ``direct`` path (``ChatCompletionsConsumer`` changes only the
wire format, the body limit and what a disconnect means: there is no resume, so the answer
stops and is stored). Every error is OpenAI's error object, with the status OpenAI's SDKs map to
their exceptions (400, 401, 403, 404, 409, 429, 5xx).

A key is a bearer token, not a cookie: no CSRF check applies (a browser never sends it by
itself), and no session is read.
"""

import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from assistant import errors, http
from assistant.consumers import ChatStreamConsumer
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.i18n import scope_translation
from assistant.models import StreamRecord
from assistant.services.answer import Answer
from assistant.services.api_answer import api_answer_start
from assistant.services.api_keys import key_presented, key_read
from assistant.services.chat_request import request_id_choose
from assistant.services.clients import scope_client
from assistant.services.openai_request import completion_request_parse
from assistant.services.openai_wire import OpenAIFrames, error_body, models_body
from assistant.services.serving_state import API_PATH
from assistant.services.timings import RECEIVED_KEY, now
from assistant.transport import CONNECTION_KEY, client_connection

Send = Callable[[dict[str, Any]], Awaitable[None]]
Outcome = StreamRecord.Outcome

#: When the model list says its one model was made: this process's start.
_CREATED = int(time.time())


async def send_api_error(
    send: Send,
    scope: Any,
    error: errors.ApiError,
    extra: http.Headers | None = None,
    *,
    param: str | None = None,
) -> None:
    """A whole error response in OpenAI's format, counted as a refusal like every other."""
    http.refusal(error)
    await http.send_json(
        send, scope, error.status, error_body(error, param=param), http.json_headers(extra)
    )


async def _discard(frame: bytes) -> None:
    """The live listener of a completion sent whole: it is built from the answer at its end."""


def _failure(answer: Answer) -> errors.ApiError:
    """The error a completion sent whole answers with when its answer did not end well."""
    if answer.outcome == Outcome.TIMEOUT:
        return errors.ENGINE_TIMEOUT
    if answer.outcome == Outcome.ENGINE_ERROR:
        return errors.ENGINE_FAILED if answer.text else errors.ENGINE_UNAVAILABLE
    if answer.outcome == Outcome.GIVEN_UP and answer.error_code in errors.GIVEN_UP:
        return errors.GIVEN_UP[answer.error_code]
    return errors.SERVER_FAILED


class ChatCompletionsConsumer(ChatStreamConsumer):
    """``POST /v1/chat/completions``: one answer, streamed as OpenAI chunks or sent whole."""

    serving_path = API_PATH

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The status line went out: a failure now is an error chunk.
        self.headers_sent = False

    def body_limit(self) -> int:
        return settings.CHATSITE_API["MAX_BODY_BYTES"]

    def client_gone(self, answer: Answer) -> None:
        """No API client resumes: the answer stops now, and what it said is stored."""
        answer.detach()
        answer.stop()

    async def send_error(
        self,
        error: errors.ApiError,
        extra: list[tuple[bytes, bytes]] | None = None,
        *,
        param: str | None = None,
    ) -> None:
        self.response_started = self.headers_sent = True
        await send_api_error(self.send, self.scope, error, extra, param=param)

    async def crashed(self) -> None:
        if self.disconnected or self.body_ended:
            return
        if not self.headers_sent:
            await self.send_error(errors.SERVER_FAILED)
        elif self.answer is not None:
            await self.send_body(self.answer.frames.server_error(), more_body=False)

    async def answer_or_refuse(self, body: bytes) -> None:
        # Method, content type, host and declared length were checked by ``OpenAIRouter``.
        scope = self.scope
        request_id = request_id_choose(http.header(scope, b"x-request-id"))
        try:
            presented = key_presented(http.header(scope, b"authorization"))
            request = completion_request_parse(body)
            answer = await api_answer_start(
                request=request,
                presented=presented,
                client=scope_client(scope),
                request_id=request_id,
                timings=self.timings,
            )
        except Rejected as rejected:
            param = getattr(rejected, "param", None)
            await self.send_error(rejected.error, rejected.headers(), param=param)
            return
        self.response_started = True
        self.answer = answer
        if request.stream:
            self.stream_headers = [*http.sse_headers(request_id), *http.security_headers(scope)]
            await self.stream(answer)
            return
        await answer.run(live=_discard)
        if self.disconnected:
            return
        if answer.outcome != Outcome.OK:
            await self.send_error(_failure(answer), [(b"x-request-id", request_id.encode())])
            return
        frames = answer.frames
        assert isinstance(frames, OpenAIFrames)  # services/api_answer.py made it so
        body = frames.completion(
            content="".join(answer.text),
            finish_reason=answer.finish_reason or "stop",
            usage=(answer.prompt_tokens, answer.completion_tokens),
            deltas=answer.timings.tokens,
        )
        self.headers_sent = True
        headers = http.json_headers([(b"x-request-id", request_id.encode("ascii"))])
        await http.send_json(self.send, scope, 200, body, headers)

    async def send_frame(self, frame: bytes, *, more_body: bool = True) -> None:
        self.headers_sent = True
        await super().send_frame(frame, more_body=more_body)


def _preflight(scope: Any) -> tuple[errors.ApiError, http.Headers] | None:
    """What a completion request is refused for before its body is read."""
    if scope["method"] != "POST":
        return errors.API_METHOD_NOT_ALLOWED, [(b"allow", b"POST")]
    if not http.is_json(http.header(scope, b"content-type")):
        return errors.UNSUPPORTED_MEDIA_TYPE, []
    if not http.host_allowed(scope):
        return errors.BAD_HOST, []
    if http.declared_length(scope) > settings.CHATSITE_API["MAX_BODY_BYTES"]:
        return errors.BODY_TOO_LARGE, []
    return None


async def models_list(scope: Any, send: Send) -> None:
    """``GET /v1/models``: the model this site serves, to a valid key."""
    if scope["method"] != "GET":
        await send_api_error(send, scope, errors.API_MODELS_METHOD, [(b"allow", b"GET")])
        return
    if not http.host_allowed(scope):
        await send_api_error(send, scope, errors.BAD_HOST)
        return
    try:
        await run_db(key_read, key_presented(http.header(scope, b"authorization")))
    except Rejected as rejected:
        await send_api_error(send, scope, rejected.error, rejected.headers())
        return
    body = models_body(settings.CHATSITE_API["MODEL"], _CREATED)
    await http.send_json(send, scope, 200, body, http.json_headers())


class OpenAIRouter:
    """Everything under ``/v1/``: note the arrival time, refuse what is wrong before the body,
    and hand a completion to its consumer."""

    def __init__(self) -> None:
        self.completions = ChatCompletionsConsumer.as_asgi()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope[RECEIVED_KEY] = now()
        scope[CONNECTION_KEY] = client_connection(send)
        with scope_translation(scope):
            path = scope["path"].rstrip("/")
            if path == "/v1/chat/completions":
                refused = _preflight(scope)
                if refused is not None:
                    await send_api_error(send, scope, refused[0], refused[1])
                    return
                await self.completions(scope, receive, send)
            elif path == "/v1/models":
                await models_list(scope, send)
            else:
                await send_api_error(send, scope, errors.API_NOT_FOUND)


__all__ = ["OpenAIRouter"]
