"""The streaming consumer's own message loop: each ASGI message is received and dispatched in
the consumer's task, one after the other, and the consumer returns once a handler stops it.
(Channels' stock loop awaits every ``receive`` in a task of its own.)"""

import asyncio
import json
from typing import Any

from assistant.consumers import ChatStreamConsumer


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/chat/stream/direct",
        "raw_path": b"/api/chat/stream/direct",
        "root_path": "",
        "query_string": b"",
        # No CSRF cookie or token: refused before anything is read or started.
        "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


def test_messages_are_received_in_the_consumer_task_until_it_stops() -> None:
    received_in: list[asyncio.Task[Any] | None] = []
    sent: list[dict[str, Any]] = []
    messages = [
        {"type": "http.request", "body": b'{"message": ', "more_body": True},
        {"type": "http.request", "body": b'"Hello"}', "more_body": False},
    ]

    async def main() -> asyncio.Task[Any]:
        ended = asyncio.Event()

        async def receive() -> dict[str, Any]:
            received_in.append(asyncio.current_task())
            if messages:
                return messages.pop(0)
            await ended.wait()  # the client leaves once the response has ended
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                ended.set()

        consumer = asyncio.ensure_future(
            ChatStreamConsumer.as_asgi()(scope(), receive, send)  # type: ignore[arg-type]
        )
        await asyncio.wait_for(consumer, timeout=30)  # returns: the disconnect stopped it
        return consumer

    consumer = asyncio.run(main())

    # Both parts of the body, then the disconnect: each received by the consumer's own task.
    assert received_in == [consumer] * 3
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 403
    assert json.loads(sent[1]["body"])["error"]["code"] == "csrf_failed"
