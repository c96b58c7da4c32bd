"""vLLM's ``AsyncLLM`` inside the server process (needs ``.[vllm]`` and a GPU).

Saves the HTTP hop to a separate ``vllm serve`` at the cost of tying the model's lifetime to the
web worker; use one worker per GPU. Outputs are requested as deltas (``RequestOutputKind.DELTA``)
so nothing re-sends the text so far, and closing the stream aborts the request in the engine.
vllm is imported only when this backend is loaded.
"""

import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from .base import BaseEngine, ChatMessage, Delta, EngineError, EngineUnavailable, GenerationParams


class VLLMInProcessEngine(BaseEngine):
    name = "vllm-inprocess"
    requires_gpu = True

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        super().__init__(alias, options)
        self.model = str(options.get("MODEL") or "")
        self.engine_args: dict[str, Any] = dict(options.get("ENGINE_ARGS") or {})
        self._llm: Any = None
        self._tokenizer: Any = None
        self._load_lock = threading.Lock()

    def load(self) -> None:
        with self._load_lock:
            if self._llm is not None:
                return
            try:
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM
            except ImportError as exc:
                raise EngineUnavailable(
                    "vllm is not installed: pip install '.[vllm]' on a GPU host.", code="no_vllm"
                ) from exc
            args = AsyncEngineArgs(model=self.model, **self.engine_args)
            self._llm = AsyncLLM.from_engine_args(args)

    async def _prompt(self, messages: Sequence[ChatMessage]) -> str:
        if self._tokenizer is None:
            self._tokenizer = await self._llm.get_tokenizer()
        return str(
            self._tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in messages],
                tokenize=False,
                add_generation_prompt=True,
            )
        )

    async def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.load()
        sampling = SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            repetition_penalty=params.repeat_penalty,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            output_kind=RequestOutputKind.DELTA,
        )
        request_id = uuid.uuid4().hex
        finished = False
        try:
            prompt = await self._prompt(messages)
            generated = 0  # DELTA outputs carry only the new tokens' ids
            async for output in self._llm.generate(prompt, sampling, request_id):
                done = output.finished
                for completion in output.outputs:
                    generated += len(completion.token_ids or ())
                    if completion.text or completion.finish_reason:
                        yield Delta(
                            completion.text,
                            finish_reason=completion.finish_reason,
                            prompt_tokens=len(output.prompt_token_ids or ()) if done else None,
                            completion_tokens=generated if done else None,
                        )
                finished = output.finished
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"vLLM failed: {exc!r}") from exc
        finally:
            if not finished:
                await self._llm.abort(request_id)
