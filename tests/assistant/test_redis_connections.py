"""A worker's connections to Redis do not grow with the answers it gives, under both servers.

Django keeps a cache client per thread, and on the event loop one per task: a cache call looked
up on the event loop made a new client for every answer, and with it a new connection to Redis
(``assistant.db.run_cache``). Redis counts every connection it accepts
(``total_connections_received``): once the worker's threads are warm, more answers must not add
connections. The test runs alone against the machine's Redis, so nothing else connects meanwhile
but this test's own counter reads.
"""

import pytest
import redis

from assistant.models import StreamRecord
from tests.support import REDIS_URL, ChatClient, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "[scripted tokens=3 ttft_ms=1 itl_ms=1] Hello"
#: Answers before counting (the worker's threads and pools start), then answers counted.
WARM, COUNTED = 10, 30


def connections_received() -> int:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.info("stats")["total_connections_received"])
    finally:
        client.close()


def answered(client: ChatClient, count: int, stored: int) -> None:
    """``count`` answers, each whole, and every record stored (the stores use the cache too)."""
    for _ in range(count):
        events = client.ask(QUESTION)
        assert events[-1].event == "done", events[-3:]
    assert wait_for(lambda: StreamRecord.objects.count() == stored, timeout=30)


@pytest.mark.parametrize("server_kind", ["daphne", "uvicorn"])
def test_more_answers_open_no_more_connections_to_redis(
    worker_factory, server_kind: str, redis_prefix: str
) -> None:
    worker = worker_factory(
        CHATSITE_REDIS_URL=REDIS_URL, CHATSITE_REDIS_PREFIX=redis_prefix, CHATSITE_CHAT_RATE="1000"
    )
    client = ChatClient(worker)
    try:
        answered(client, WARM, WARM)
        before = connections_received()
        answered(client, COUNTED, WARM + COUNTED)
        opened = connections_received() - before - 1  # less the second counter read's own
    finally:
        client.close()
    # A few at most: a thread of a pool that had not run yet connects once. Per answer, 30.
    assert opened <= 3, f"{opened} connections to Redis for {COUNTED} answers"
