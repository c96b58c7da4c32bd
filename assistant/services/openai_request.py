"""Validating an OpenAI chat completions request (``POST /v1/chat/completions``).

Accepted as OpenAI documents it: ``model``, ``messages`` (``system``, ``developer``, ``user``,
``assistant``; content as text or text parts), ``stream``, ``stream_options.include_usage``,
``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``, ``frequency_penalty``,
``presence_penalty``, ``n`` (1 only). A field that would change the answer and cannot be honoured
here (tools, ``n`` > 1, logprobs) is refused; other fields (``user``, ``seed``, ``stop``, the
extras benchmarking tools send, such as ``ignore_eos``) are accepted and ignored, as
``vllm serve`` ignores fields it does not know.
"""

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.utils.translation import gettext

from assistant import errors
from assistant.engines import ChatMessage, GenerationParams
from assistant.errors import Rejected
from assistant.services.classrooms import ClassContext, system_prompt

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: Fields refused unless empty or false: honouring them needs what no engine here does.
_UNSUPPORTED = ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs")


class InvalidRequest(Rejected):
    """A 400 in OpenAI's format, naming the field (``param``) at fault."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(errors.API_INVALID_REQUEST.with_message(message))
        self.param = param


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    messages: list[ChatMessage]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None

    @property
    def question(self) -> str:
        """What is stored as the question: the last user message."""
        return self.messages[-1].content

    def class_check(self, classroom: ClassContext | None) -> None:
        """A class's key answers with its teacher's persona, which no client may replace or
        add to: a system or developer message is refused (400)."""
        if classroom is None:
            return
        for index, message in enumerate(self.messages):
            if message.role == "system":
                raise InvalidRequest(
                    gettext(
                        "This key answers with its class's persona: send no system or "
                        "developer message."
                    ),
                    param=f"messages[{index}].role",
                )

    def prompt(
        self, history: list[ChatMessage], classroom: ClassContext | None
    ) -> list[ChatMessage]:
        """The engine's messages. A class's key starts from the class's persona (the client
        sends none of its own: ``class_check``); a site key from the client's system messages,
        or the site's prompt when it sent none."""
        sent = self.messages
        if classroom is None and any(m.role == "system" for m in sent):
            return list(sent)
        system = system_prompt(classroom)
        return [ChatMessage(role="system", content=system), *sent] if system else list(sent)

    def sampling(self, base: GenerationParams, classroom: ClassContext | None) -> GenerationParams:
        """The engine alias's sampling with the request's over it, and the class's over that:
        its temperature where it sets one, its max tokens as a ceiling."""
        overrides: dict[str, Any] = {
            name: value
            for name in ("max_tokens", "temperature", "top_p", "frequency_penalty")
            if (value := getattr(self, name)) is not None
        }
        if self.presence_penalty is not None:
            overrides["presence_penalty"] = self.presence_penalty
        params = replace(base, **overrides)
        if classroom is None:
            return params
        if classroom.temperature is not None:
            params = replace(params, temperature=classroom.temperature)
        if classroom.max_tokens is not None and params.max_tokens > classroom.max_tokens:
            params = replace(params, max_tokens=classroom.max_tokens)
        return params


def completion_request_parse(body: bytes) -> CompletionRequest:
    """The request in ``body``; ``InvalidRequest`` (400) naming the field at fault, or 404
    ``model_not_found`` for a model this site does not serve."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidRequest(gettext("The request body is not valid JSON.")) from None
    if not isinstance(payload, dict):
        raise InvalidRequest(gettext("The request body must be a JSON object."))
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(gettext("Name the model: GET /v1/models lists it."), param="model")
    for name in _UNSUPPORTED:
        if payload.get(name):
            raise InvalidRequest(
                gettext("%(field)s is not supported here.") % {"field": name}, param=name
            )
    if payload.get("n") not in (None, 1):
        raise InvalidRequest(gettext("Only n = 1 is supported."), param="n")
    stream = _boolean(payload, "stream")
    options = payload.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise InvalidRequest(
            gettext("stream_options is an object, and only for stream: true."),
            param="stream_options",
        )
    request = CompletionRequest(
        model=model,
        messages=_messages(payload.get("messages")),
        stream=stream,
        include_usage=_boolean(options or {}, "include_usage"),
        max_tokens=_max_tokens(payload),
        temperature=_number(payload, "temperature", 0.0, 2.0),
        top_p=_number(payload, "top_p", 0.0, 1.0),
        frequency_penalty=_number(payload, "frequency_penalty", -2.0, 2.0),
        presence_penalty=_number(payload, "presence_penalty", -2.0, 2.0),
    )
    if model != settings.CHATSITE_API["MODEL"]:
        raise Rejected(errors.MODEL_NOT_FOUND)
    return request


def _boolean(payload: dict[str, Any], name: str) -> bool:
    value = payload.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(
            gettext("%(field)s must be true or false.") % {"field": name}, param=name
        )
    return value


def _number(payload: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequest(
            gettext("%(field)s must be a number from %(low)g to %(high)g.")
            % {"field": name, "low": low, "high": high},
            param=name,
        )
    return float(value)


def _max_tokens(payload: dict[str, Any]) -> int | None:
    name = (
        "max_completion_tokens"
        if payload.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    value = payload.get(name)
    if value is None:
        return None
    limit = settings.CHATSITE_CLASS_BOUNDS["MAX_TOKENS_MAX"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise InvalidRequest(
            gettext("%(field)s must be a whole number from 1 to %(limit)d.")
            % {"field": name, "limit": limit},
            param=name,
        )
    return value


def _messages(raw: object) -> list[ChatMessage]:
    limit = settings.CHATSITE_API["MAX_MESSAGES"]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(gettext("Send at least one message."), param="messages")
    if len(raw) > limit:
        raise InvalidRequest(
            gettext("Send at most %(limit)d messages.") % {"limit": limit}, param="messages"
        )
    messages = [_message(item, index) for index, item in enumerate(raw)]
    if messages[-1].role != "user":
        raise InvalidRequest(gettext("The last message must be the user's."), param="messages")
    return messages


def _message(item: object, index: int) -> ChatMessage:
    param = f"messages[{index}]"
    if not isinstance(item, dict):
        raise InvalidRequest(gettext("Each message is an object."), param=param)
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise InvalidRequest(
            gettext("The role must be system, developer, user or assistant."),
            param=f"{param}.role",
        )
    content = _content(item.get("content"), f"{param}.content")
    limit = settings.CHATSITE_STREAM["MAX_MESSAGE_CHARS"]
    if len(content) > limit:
        raise InvalidRequest(
            gettext("The message is longer than %(limit)d characters.") % {"limit": limit},
            param=f"{param}.content",
        )
    if _UNSTORABLE.search(content):
        raise InvalidRequest(
            gettext("The message contains characters that are not text."), param=f"{param}.content"
        )
    if role == "user" and not content.strip():
        raise InvalidRequest(gettext("Type a message first."), param=f"{param}.content")
    return ChatMessage(role=role, content=content)  # type: ignore[arg-type]


def _content(value: object, param: str) -> str:
    """Text, or a list of text parts (``{"type": "text", "text": ...}``) joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise InvalidRequest(gettext("Only text content is supported here."), param=param)
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(gettext("A text part needs its text."), param=param)
            texts.append(text)
        return "\n".join(texts)
    raise InvalidRequest(gettext("The content must be text."), param=param)
