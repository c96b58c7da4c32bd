"""The floor of an ASGI server: a raw ASGI application that writes the frames chatsite writes.

``benchmarks/added_latency.py`` and ``benchmarks/cost_per_answer.py`` run it under Daphne
(``daphne-raw``) and under uvicorn (``uvicorn-raw``) beside chatsite on the same server, so that
what chatsite's own work costs per answer is the difference, and the ratio, against the server
alone. It does what a chat stream does on the wire and nothing else: read the whole body, send
``: open`` and a ``meta`` event, wait the engine's first-token delay, then send one ``token``
event per token (``ITL`` apart) and a ``done`` event with timings, each as its own
``http.response.body`` message, then close the body. No routing, no checks, no storage, no
metrics.

The benchmarks run it as ``python -m chatsite.server ...
assistant.benchmarking.raw_app:application`` (Daphne as chatsite runs it, on the same event
loop) and under uvicorn; the engine's pace comes from ``RAW_TTFT_MS``, ``RAW_TOKENS`` and
``RAW_ITL_MS``.
"""

import asyncio
import os
import uuid
from typing import Any

from assistant.sse import encode_comment, encode_json_event

TTFT_S = float(os.environ.get("RAW_TTFT_MS", "100")) / 1000
TOKENS = int(os.environ.get("RAW_TOKENS", "20"))
ITL_S = float(os.environ.get("RAW_ITL_MS", "20")) / 1000

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


def frames_meta() -> bytes:
    """A ``meta`` event of the size of chatsite's (four ids, the path and the engine)."""
    return encode_json_event(
        {
            "request_id": uuid.uuid4().hex,
            "conversation": str(uuid.uuid4()),
            "message": str(uuid.uuid4()),
            "user_message": str(uuid.uuid4()),
            "path": "direct",
            "engine": "scripted",
        },
        event="meta",
    )


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            kind = (await receive())["type"]
            await send({"type": f"{kind}.complete"})  # lifespan.startup or .shutdown
            if kind == "lifespan.shutdown":
                return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": encode_comment("open"), "more_body": True})
    await send({"type": "http.response.body", "body": frames_meta(), "more_body": True})
    await asyncio.sleep(TTFT_S)
    for token in range(1, TOKENS + 1):
        if token > 1:
            await asyncio.sleep(ITL_S)
        frame = encode_json_event({"text": f" t{token}"}, event="token", id=str(token))
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    done = {"finish_reason": "stop", "tokens": TOKENS, "timings": {"ttft_ms": TTFT_S * 1000}}
    await send(
        {
            "type": "http.response.body",
            "body": encode_json_event(done, event="done"),
            "more_body": True,
        }
    )
    await send({"type": "http.response.body", "body": b"", "more_body": False})
