"""The engine contract: chat messages in, an async iterator of small frozen deltas out.

Closing the iterator (``aclose()``, or cancelling the task that iterates it) must stop generation
upstream promptly: free the llama.cpp thread, close the HTTP response so vLLM aborts, abort the
in-process request. Errors before the first delta are ``EngineUnavailable`` (the caller can still
answer 503); errors after it are ``EngineError`` (the caller ends the stream with an error event).
"""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, NamedTuple

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """How an answer is sampled. Each engine has its own defaults (``default_generation``),
    overridden per alias from settings; a field an engine cannot honour is left at its neutral
    value (1.0 for the multiplicative penalty, 0.0 for the additive ones)."""

    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    #: Multiplies down the logits of tokens seen in the recent window (llama.cpp, vLLM).
    repeat_penalty: float = 1.0
    #: OpenAI's additive penalties: per occurrence, and once for any occurrence.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


#: Engine options that override a field of ``GenerationParams``, by option name.
GENERATION_OPTIONS = {
    "MAX_TOKENS": "max_tokens",
    "TEMPERATURE": "temperature",
    "TOP_P": "top_p",
    "REPEAT_PENALTY": "repeat_penalty",
    "FREQUENCY_PENALTY": "frequency_penalty",
    "PRESENCE_PENALTY": "presence_penalty",
}


class Delta(NamedTuple):
    """A piece of the answer. The last one may carry only a finish reason ("stop", "length").

    Immutable like the contract's other values, but a named tuple rather than a frozen
    dataclass: an engine makes one for every token, and a frozen dataclass's ``__init__`` sets
    each field through ``object.__setattr__`` (1.39 against 0.51 µs a delta)."""

    text: str
    finish_reason: str | None = None
    #: Set (with empty text) while the request waits for the engine: 1 means next.
    queue_position: int | None = None
    #: The prompt's and the answer's lengths in tokens, where the engine tells them (on any
    #: one delta; a delta may hold several tokens, so the answer's is not the deltas' count).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class EngineError(Exception):
    """Generation failed. ``code`` is a short, stable reason for metrics and the error event."""

    code: str = "engine_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class EngineUnavailable(EngineError):
    """The engine could not start this request (down, refused, overloaded, not loaded)."""

    code = "engine_unavailable"


class EngineBusy(EngineUnavailable):
    """This process already runs as many streams on the engine as it may (``MAX_STREAMS``), and
    none of them gives its seat up (``services/seats.py``)."""

    code = "engine_busy"


class EngineTimeout(EngineError):
    """No first token, or no next token, within the configured time."""

    code = "engine_timeout"


def generation_from_options(
    defaults: GenerationParams, options: dict[str, Any]
) -> GenerationParams:
    """``defaults`` with the fields that ``options`` set (``None`` or absent: keep the default)."""
    overrides: dict[str, Any] = {}
    for option, field_name in GENERATION_OPTIONS.items():
        value = options.get(option)
        if value is not None:
            overrides[field_name] = int(value) if field_name == "max_tokens" else float(value)
    return replace(defaults, **overrides)


class BaseEngine(ABC):
    """Base class for engine backends. Subclasses set the capability flags below."""

    #: A short name for metrics labels and logs.
    name: ClassVar[str] = "base"
    #: Closing the stream stops the work upstream (not only our reading of it).
    supports_cancel: ClassVar[bool] = True
    #: Needs a GPU and an optional, heavy dependency.
    requires_gpu: ClassVar[bool] = False
    #: How this backend samples unless its alias's options say otherwise.
    default_generation: ClassVar[GenerationParams] = GenerationParams()

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        self.alias = alias
        self.options = options
        #: Streams this process may run on the engine at once (0: no limit): its seats
        #: (``services/seats.py``).
        self.max_streams = int(options.get("MAX_STREAMS") or 0)
        #: The sampling every answer on this alias uses.
        self.generation = generation_from_options(self.default_generation, options)
        #: The languages the model answers in (ISO 639-1 codes, lower case).
        self.languages = frozenset(
            str(code).strip().lower() for code in options.get("LANGUAGES") or ("en",)
        )

    def speaks(self, language: str) -> bool:
        """Whether the model answers in ``language`` (a language code: zh-hans, en-us, zh...)."""
        return language.split("-")[0].lower() in self.languages

    def load(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Load weights or open resources. Called once per process, before the first request."""

    @abstractmethod
    def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        """Generate the assistant's answer to ``messages`` as deltas."""

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise ``EngineUnavailable`` if this engine cannot take a request now.

        Called before the response starts, so it must be cheap: no I/O, no waiting.
        """

    async def ready(self) -> None:
        """Raise ``EngineUnavailable`` if this engine could not answer now (readiness probes).

        May do a little I/O (one small request to a model server); the caller bounds its time.
        """
        self.check()

    def contended(self) -> bool:
        """Another request waits for this engine because it answers one at a time. An answer
        nobody listens to gives the engine up then (services/answer_buffer.py)."""
        return self.queue_depth() > 0

    def queue_depth(self) -> int:
        """Requests waiting for this engine (0 for engines that batch)."""
        return 0

    def describe(self) -> dict[str, Any] | None:
        """What the staff dashboard shows about this engine's own process, if it has one
        (synchronous; may ask it, bounded). None for engines that run in the worker or that
        another team operates."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release process-wide resources (HTTP clients, threads)."""
