"""OpenAI's chat completions wire format: the chunks of a stream, a whole completion, the model
list and the error object, as OpenAI's API and ``vllm serve`` write them.

A stream is ``chat.completion.chunk`` messages (no ``event:`` line): the first carries the role,
each token a ``delta.content``, the last choice its ``finish_reason``; then, when the request set
``stream_options.include_usage``, a chunk with no choices and the ``usage``; then
``data: [DONE]``. An error after the stream began is a message with an ``error`` object, then
``[DONE]``. Comments (``: open``, ``: ping``) are ignored by every client.
"""

import json
import time
from dataclasses import dataclass, field
from typing import Any

from django.utils.functional import Promise

from assistant import sse
from assistant.errors import ApiError
from assistant.services.frames import OPEN, Frames

DONE = b"data: [DONE]\n\n"

#: OpenAI's error ``type`` for each status (its SDKs raise by status alone).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_object(
    code: str, message: str | Promise, *, status: int, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": str(message), "type": kind, "param": param, "code": code}}


def error_body(error: ApiError, *, param: str | None = None) -> bytes:
    return json.dumps(
        error_object(error.code, error.message, status=error.status, param=param)
    ).encode()


def models_body(model: str, created: int) -> bytes:
    """``GET /v1/models``: the one model this site serves (the split picks the engine)."""
    entry = {"id": model, "object": "model", "created": created, "owned_by": "chatsite"}
    return json.dumps({"object": "list", "data": [entry]}).encode()


def usage_of(counted: tuple[int | None, int | None], deltas: int) -> dict[str, int]:
    """OpenAI's ``usage`` from the engine's counts (prompt, answer) where it told them: else
    the answer's is the deltas streamed (one token each on llama.cpp), the prompt's 0."""
    prompt = counted[0] or 0
    completion = counted[1] if counted[1] is not None else deltas
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@dataclass
class OpenAIFrames(Frames):
    """An answer's frames as OpenAI chunks, for one completion."""

    completion_id: str
    model: str
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    _role_sent: bool = False

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI sends it: only the last chunk's is set
        return sse.encode_json_event({**chunk, **extra})

    def _role(self) -> bytes:
        """The chunk that carries the role: once, before the first content (or the end)."""
        if self._role_sent:
            return b""
        self._role_sent = True
        return self._chunk([self._choice({"role": "assistant", "content": ""})])

    def _choice(self, delta: dict[str, str], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def open(self) -> bytes:
        return OPEN  # the status and headers go now: the client knows it was accepted

    def meta(self, **_ids: Any) -> bytes:
        return b""  # the ids are in the headers (X-Request-ID) and in every chunk

    def token(self, text: str, token_id: int) -> bytes:
        # As vLLM does: the role goes in its own chunk, sent with the first token.
        return self._role() + self._chunk([self._choice({"content": text})])

    def queue(self, position: int) -> bytes:
        return sse.encode_comment(f"queue {position}")

    def done(
        self,
        *,
        finish_reason: str,
        tokens: int,
        timings: dict[str, float | int | None],
        usage: tuple[int | None, int | None],
    ) -> bytes:
        frames = self._role() + self._chunk([self._choice({}, finish_reason)])
        if self.include_usage:
            frames += self._chunk([], usage=usage_of(usage, tokens))
        return frames + DONE

    def error(self, code: str, message: str | Promise) -> bytes:
        status = 504 if code.endswith("_timeout") else 500
        return sse.encode_json_event(error_object(code, message, status=status)) + DONE

    def server_error(self) -> bytes:
        return self.error("server_error", "The server failed while answering.")

    def completion(
        self, *, content: str, finish_reason: str, usage: tuple[int | None, int | None], deltas: int
    ) -> bytes:
        """The same answer as one ``chat.completion`` (``stream: false``): its id, model and
        time are this stream's."""
        return json.dumps(
            {
                "id": self.completion_id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": usage_of(usage, deltas),
            },
            ensure_ascii=False,
        ).encode("utf-8")
