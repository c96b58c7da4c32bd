"""The engine contract: chat messages in, an async iterator of small frozen deltas out.

Closing the iterator (``aclose()``, or cancelling the task that iterates it) must stop generation
upstream promptly: free the llama.cpp thread, close the HTTP response so vLLM aborts, abort the
in-process request. Errors before the first delta are ``EngineUnavailable`` (the caller can still
answer 503); errors after it are ``EngineError`` (the caller ends the stream with an error event).
"""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class GenerationParams:
    max_tokens: int = 512
    temperature: float = 0.7


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of the answer. The last one may carry only a finish reason ("stop", "length")."""

    text: str
    finish_reason: str | None = None
    #: Set (with empty text) while the request waits for the engine: 1 means next.
    queue_position: int | None = None


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
    """This process already runs as many streams on the engine as it may (``MAX_STREAMS``)."""

    code = "engine_busy"


class EngineTimeout(EngineError):
    """No first token, or no next token, within the configured time."""

    code = "engine_timeout"


class BaseEngine(ABC):
    """Base class for engine backends. Subclasses set the capability flags below."""

    #: A short name for metrics labels and logs.
    name: ClassVar[str] = "base"
    #: Closing the stream stops the work upstream (not only our reading of it).
    supports_cancel: ClassVar[bool] = True
    #: Needs a GPU and an optional, heavy dependency.
    requires_gpu: ClassVar[bool] = False

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        self.alias = alias
        self.options = options
        #: Streams this process may run on the engine at once (0: no limit).
        self.max_streams = int(options.get("MAX_STREAMS") or 0)
        self.streams = 0

    def admit(self) -> None:
        """Count one more stream, or raise ``EngineBusy`` when the engine is full.

        Answering 503 at once beats queueing without end: the page says when to try again.
        """
        if self.max_streams and self.streams >= self.max_streams:
            raise EngineBusy(f"{self.streams} streams already running on {self.alias!r}")
        self.streams += 1

    def release(self) -> None:
        self.streams -= 1

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

    def queue_depth(self) -> int:
        """Requests waiting for this engine in this process (0 for engines that batch)."""
        return 0

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release process-wide resources (HTTP clients, threads)."""
