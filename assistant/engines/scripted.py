"""A deterministic engine for tests and benchmarks.

Yields a fixed list of tokens after ``TTFT_MS``, then one every ``ITL_MS``. A request can override
the defaults with a directive at the start of its last user message, for example
``[scripted tokens=5 ttft_ms=0 fail_after=3]`` (``fail_after=0`` fails before the first token,
``hang=1`` never produces a token, ``text='...'`` is JSON: a list of tokens to send, or a string
sent one character per token, ``size=N`` pads every token to N characters).

Every start (with the messages and the sampling it was given), finish and cancellation is
appended as one JSON line to the file named by ``EVENTS_FILE`` (env
``CHATSITE_SCRIPTED_EVENTS_FILE``) with ``time.monotonic()``, which is the same clock in every
process on the machine, so a test in another process can tell how long after its disconnect
the generation stopped.
"""

import asyncio
import json
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from typing import Any

from .base import BaseEngine, ChatMessage, Delta, EngineError, EngineUnavailable, GenerationParams

_WORDS = (
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. "
    "Plants capture light with chlorophyll in their leaves, split water, and use the "
    "energy to build glucose that feeds the whole plant."
).split(" ")
_DIRECTIVE = re.compile(r"^\[scripted(?P<args>(?:'[^']*'|[^\]'])*)\]\s*")
_ARG = re.compile(r"(\w+)=('(?:[^']*)'|\S+)")


def default_tokens(count: int) -> list[str]:
    """``count`` tokens of a fixed sentence, each but the first with its leading space."""
    return [(" " if i else "") + _WORDS[i % len(_WORDS)] for i in range(count)]


def parse_directive(text: str) -> dict[str, str]:
    match = _DIRECTIVE.match(text)
    if not match:
        return {}
    return {key: value.strip("'") for key, value in _ARG.findall(match.group("args"))}


def _tokens_from_json(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        raise EngineUnavailable("The scripted engine's text= is not JSON.") from None
    # A list is sent item by item; a string one character per token.
    return [str(t) for t in value] if isinstance(value, list) else list(str(value))


class ScriptedEngine(BaseEngine):
    name = "scripted"

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        super().__init__(alias, options)
        self.ttft_ms = int(options.get("TTFT_MS", 50))
        self.itl_ms = int(options.get("ITL_MS", 20))
        self.tokens = int(options.get("TOKENS", 20))
        self.events_file = options.get("EVENTS_FILE") or os.environ.get(
            "CHATSITE_SCRIPTED_EVENTS_FILE", ""
        )
        self.active = 0

    def _record(self, event: str, **fields: Any) -> None:
        if not self.events_file:
            return
        line = json.dumps({"event": event, "t": time.monotonic(), **fields})
        with open(self.events_file, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    async def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        args = parse_directive(last_user)
        ttft = int(args.get("ttft_ms", self.ttft_ms)) / 1000
        itl = int(args.get("itl_ms", self.itl_ms)) / 1000
        if "text" in args:
            tokens = _tokens_from_json(args["text"])
        else:
            tokens = default_tokens(int(args.get("tokens", self.tokens)))
        if "size" in args:
            tokens = [token.ljust(int(args["size"]), ".") for token in tokens]
        fail_after = int(args["fail_after"]) if "fail_after" in args else None
        tag = args.get("tag", "")
        tokens = tokens[: params.max_tokens]

        if self.events_file:  # what it was given, built only when it is written down
            self._record(
                "start",
                tag=tag,
                messages=len(messages),
                # What it was given, so a test can tell what reached the engine.
                given=[[m.role, m.content] for m in messages],
                params=asdict(params),
            )
        self.active += 1
        sent = 0
        try:
            if fail_after == 0:
                raise EngineUnavailable("The scripted engine was told to fail before answering.")
            if args.get("hang"):
                await asyncio.Event().wait()
            await asyncio.sleep(ttft)
            for i, token in enumerate(tokens):
                if i:
                    await asyncio.sleep(itl)
                if fail_after is not None and sent >= fail_after:
                    raise EngineError("The scripted engine was told to fail mid-answer.")
                sent += 1
                yield Delta(token)
            finish = "length" if len(tokens) >= params.max_tokens else "stop"
            # Its "tokenizer": the prompt's words (what a usage report can be checked against).
            prompt_tokens = sum(len(m.content.split()) for m in messages)
            yield Delta("", finish_reason=finish, prompt_tokens=prompt_tokens)
            self._record("finish", tag=tag, tokens=sent)
        except (asyncio.CancelledError, GeneratorExit):
            self._record("cancel", tag=tag, tokens=sent)
            raise
        finally:
            self.active -= 1
