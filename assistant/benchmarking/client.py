"""One browser asking one question at a time, and what it measures of each answer."""

import asyncio
import functools
import json
import ssl
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from .frames import SSEEvent, SSEParser

STREAM_PATHS = {
    "auto": "/api/chat/stream",
    "direct": "/api/chat/stream/direct",
    "django": "/api/chat/stream/django",
}
Outcome = Literal["ok", "error_event", "http_error", "timeout", "connection_error", "incomplete"]


class BenchmarkError(Exception):
    """The run cannot go on; the message says why, for the operator."""


class EndpointNotFound(BenchmarkError):
    """The server answered 404 to the stream URL: it does not serve that path."""

    def __init__(self, url: str) -> None:
        super().__init__(f"POST {url} answered 404 Not Found.")
        self.url = url


@dataclass(slots=True)
class Sample:
    """One question and what the client saw of its answer (milliseconds, ``None``: never)."""

    index: int
    worker: int
    prompt_index: int
    started_s: float = 0.0  # when it was sent, seconds since the measured run began
    scheduled_s: float | None = None  # open loop: when it was due
    outcome: Outcome = "incomplete"
    error: str | None = None  # the error event's code, "<status> <code>", or the exception
    status: int | None = None
    #: The Retry-After header of a refusal (429, 503), as sent.
    retry_after: str | None = None
    request_id: str | None = None
    headers_ms: float | None = None
    ttfb_ms: float | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tokens: int = 0
    itl_ms: list[float] = field(default_factory=list)
    server_ttft_ms: float | None = None
    engine_ttft_ms: float | None = None
    server_timings: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        """The outcome with its code, for counting errors by kind."""
        return self.outcome if self.error is None else f"{self.outcome}: {self.error}"

    @property
    def tpot_ms(self) -> float | None:
        """vLLM's time per output token: (E2E - TTFT) / (tokens - 1)."""
        if self.ttft_ms is None or self.e2e_ms is None or self.tokens < 2:
            return None
        return round((self.e2e_ms - self.ttft_ms) / (self.tokens - 1), 3)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tpot_ms": self.tpot_ms}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _error_code(body: bytes) -> str | None:
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building one loads the CA bundle (50-100 ms of CPU): once per process, not per student,
    # or a student joining mid-run would stall every stream being timed on this event loop.
    return httpx.create_ssl_context()


class Student:
    """One browser on the site: a cookie jar, a CSRF token and (with ``keepalive``) one
    connection, asking one question at a time."""

    def __init__(
        self,
        *,
        base_url: str,
        path: str = "auto",
        timeout: float = 60.0,
        keepalive: bool = False,
        source: str | None = None,
    ) -> None:
        """``source``: the local address to connect from (a crowd on loopback spreads over
        127.0.0.0/8, as students come from many addresses; the site limits each one)."""
        base = base_url.rstrip("/")
        url = httpx.URL(base)  # normalised as the Host header will be: no default port
        self.page_url = base + "/"
        self.stream_url = base + STREAM_PATHS[path]
        self.origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
        self.timeout = timeout
        # No idle connection kept: every request opens its own, as a browser's new stream does.
        limits = httpx.Limits(max_keepalive_connections=None if keepalive else 0)
        transport = httpx.AsyncHTTPTransport(
            limits=limits, verify=_ssl_context(), local_address=source
        )
        self.client = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def open(self) -> None:
        """Load the page once, as the browser does before the first question."""
        try:
            async with asyncio.timeout(self.timeout):
                response = await self.client.get(self.page_url)
        except (TimeoutError, httpx.HTTPError) as exc:
            raise BenchmarkError(f"GET {self.page_url} failed: {exc!r}") from exc
        if response.status_code != 200:
            raise BenchmarkError(f"GET {self.page_url} answered {response.status_code}.")
        if "csrftoken" not in self.client.cookies:
            raise BenchmarkError(f"GET {self.page_url} set no csrftoken cookie.")

    async def aclose(self) -> None:
        await self.client.aclose()

    async def ask(
        self,
        prompt: str,
        *,
        index: int = 0,
        worker: int = 0,
        prompt_index: int = 0,
        epoch: float = 0,
    ) -> Sample:
        """Send one question and read its whole answer; whatever the server or the network does
        ends up in the sample, never in an exception. ``epoch``: zero of ``started_s``."""
        sample = Sample(index=index, worker=worker, prompt_index=prompt_index)
        request = self.client.build_request(
            "POST",
            self.stream_url,
            json={"message": prompt, "conversation": None},
            headers={
                "Accept": "text/event-stream",
                "X-CSRFToken": self.client.cookies.get("csrftoken", ""),
                "Origin": self.origin,
                "Referer": self.page_url,
            },
        )
        sent = time.perf_counter()
        sample.started_s = round(sent - epoch, 6)
        try:
            async with asyncio.timeout(self.timeout):
                response = await self.client.send(request, stream=True)
                try:
                    await self._read(response, sample, sent)
                finally:
                    await response.aclose()
        except (TimeoutError, httpx.TimeoutException):
            if sample.e2e_ms is None:  # after done/error the measurement is already complete
                sample.outcome, sample.error = "timeout", None
        except httpx.HTTPError as exc:
            if sample.e2e_ms is None:
                sample.outcome, sample.error = "connection_error", type(exc).__name__
        return sample

    async def _read(self, response: httpx.Response, sample: Sample, sent: float) -> None:
        sample.headers_ms = _ms(time.perf_counter() - sent)
        sample.status = response.status_code
        sample.request_id = response.headers.get("x-request-id")
        content_type = response.headers.get("content-type", "")
        if response.status_code != 200 or not content_type.startswith("text/event-stream"):
            body = await response.aread()
            code = _error_code(body) or ("not an event stream" if response.is_success else None)
            sample.outcome = "http_error"
            sample.retry_after = response.headers.get("retry-after")
            sample.error = f"{response.status_code} {code}" if code else str(response.status_code)
            sample.e2e_ms = _ms(time.perf_counter() - sent)
            return
        parser = SSEParser()
        last_token: float | None = None
        async for chunk in response.aiter_raw():
            now = time.perf_counter()
            if sample.ttfb_ms is None:
                sample.ttfb_ms = _ms(now - sent)
            for event in parser.feed(chunk):
                if event.event == "token":
                    if last_token is None:
                        sample.ttft_ms = _ms(now - sent)
                    else:
                        sample.itl_ms.append(_ms(now - last_token))
                    last_token = now
                    sample.tokens += 1
                elif event.event in ("done", "error") and sample.e2e_ms is None:
                    sample.e2e_ms = _ms(now - sent)
                    self._finish(sample, event)
            # Reading on to the end of the body lets a keep-alive connection be reused.
        if sample.e2e_ms is None:
            sample.e2e_ms = _ms(time.perf_counter() - sent)
            sample.outcome = "incomplete"

    @staticmethod
    def _finish(sample: Sample, event: SSEEvent) -> None:
        try:
            payload = json.loads(event.data)
        except ValueError:
            payload = {}
        payload = payload if isinstance(payload, dict) else {}
        if event.event == "error":
            sample.outcome, sample.error = "error_event", str(payload.get("code", "unknown"))
            return
        sample.outcome = "ok"
        timings = payload.get("timings")
        if isinstance(timings, dict):
            sample.server_timings = timings
            sample.server_ttft_ms = timings.get("server_ttft")
            sample.engine_ttft_ms = timings.get("engine_ttft")
