"""vLLM (or any OpenAI-compatible server) over HTTP: ``POST {BASE_URL}/chat/completions``.

One ``httpx.AsyncClient`` per event loop is shared by every request, so connections stay alive
between requests and the TCP and HTTP setup is not paid on the path to the first token (an
answer is read past ``[DONE]`` to the end of its body, or its connection could not be reused).
Closing the stream closes the upstream response; the server sees the connection drop and aborts
the request (vLLM frees the sequence's KV cache at once). A stream that ends before ``[DONE]`` or
a finish reason is an error, never a silently shortened answer.
"""

import asyncio
import contextlib
import json
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from .base import BaseEngine, ChatMessage, Delta, EngineError, EngineUnavailable, GenerationParams

#: How long to wait for the end of the body after [DONE] before giving the connection up.
DRAIN_TIMEOUT_S = 1.0


class OpenAIHTTPEngine(BaseEngine):
    name = "openai-http"

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        super().__init__(alias, options)
        self.base_url = str(options.get("BASE_URL") or "http://127.0.0.1:8100/v1").rstrip("/")
        self.model = str(options.get("MODEL") or "")
        self.api_key = str(options.get("API_KEY") or "")
        self.connect_timeout = float(options.get("CONNECT_TIMEOUT", 5.0))
        self.read_timeout = float(options.get("READ_TIMEOUT", 60.0))
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> httpx.AsyncClient:
        """The shared client of the running event loop."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=headers,
                timeout=httpx.Timeout(self.read_timeout, connect=self.connect_timeout),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def ready(self) -> None:
        """The model server answers its model list."""
        try:
            response = await self.client().get("/models")
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"Cannot reach the model server: {exc!r}") from exc
        if response.status_code != 200:
            raise EngineUnavailable(f"The model server answered {response.status_code}")

    async def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        client = self.client()
        payload = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "stream": True,
            # Token counts come in a last chunk (OpenAI's API, vLLM and llama.cpp's server
            # honour it): the API's usage reports them.
            "stream_options": {"include_usage": True},
        }
        # Neutral values are left out, so the served model's own generation config (which vLLM
        # applies to whatever a request does not set) decides them.
        optional = {
            "top_p": (params.top_p, 1.0),
            "frequency_penalty": (params.frequency_penalty, 0.0),
            "presence_penalty": (params.presence_penalty, 0.0),
            # vLLM's own field: OpenAI's API has none like it.
            "repetition_penalty": (params.repeat_penalty, 1.0),
        }
        payload.update({k: value for k, (value, neutral) in optional.items() if value != neutral})
        request = client.build_request("POST", "/chat/completions", json=payload)
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"Cannot reach the model server: {exc!r}") from exc
        started = done = finished = False
        try:
            if response.status_code != 200:
                detail = (await response.aread())[:300].decode("utf-8", "replace")
                raise EngineUnavailable(
                    f"The model server answered {response.status_code}: {detail}"
                )
            lines = response.aiter_lines()
            async for line in lines:
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                for delta in _parse_chunk(data, started=started):
                    started = True
                    finished = finished or delta.finish_reason is not None
                    yield delta
            if done:
                await _drain(lines)
        except httpx.TransportError as exc:
            raise _broken(f"The model server stream broke: {exc!r}", started) from exc
        finally:
            await response.aclose()
        if not (done or finished):
            # Cut short without a transport error: a body without a length or chunks ends when
            # the server closes the connection, whenever that happens.
            raise _broken("The model server closed the stream before it finished.", started)


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read the body to its end after [DONE], briefly, so that the connection goes back to the
    pool: a response closed before its last chunk closes the connection with it."""
    with contextlib.suppress(TimeoutError, httpx.TransportError):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in lines:
                pass


def _broken(message: str, started: bool) -> EngineError:
    """The error for a stream that broke, by whether the caller has seen a delta yet."""
    error = EngineError if started else EngineUnavailable
    return error(message, code="upstream_closed")


def _parse_chunk(data: str, *, started: bool) -> list[Delta]:
    """The deltas in one ``data:`` payload; ``bad_chunk`` if it is not a completion chunk."""
    error = EngineError if started else EngineUnavailable
    try:
        chunk = json.loads(data)
        choice = chunk["choices"][0] if chunk.get("choices") else {}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise error("The model server sent a malformed chunk.", code="bad_chunk") from exc
    if not isinstance(choice, dict):
        raise error("The model server sent a malformed chunk.", code="bad_chunk")
    text = (choice.get("delta") or {}).get("content") or ""
    finish = choice.get("finish_reason")
    deltas = [Delta(text, finish_reason=finish)] if (text or finish) else []
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        counts = [usage.get(name) for name in ("prompt_tokens", "completion_tokens")]
        if all(isinstance(count, int) for count in counts):
            deltas.append(Delta("", prompt_tokens=counts[0], completion_tokens=counts[1]))
    return deltas
