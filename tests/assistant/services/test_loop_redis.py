"""An answer's stream slot given back from the event loop (``assistant/loop_redis.py``), on the
production profile's slots in the real Redis at 127.0.0.1:6379 (under a prefix of each test's
own): without a trip to a database thread where the server gave its loop a client, through one
everywhere else, and the client's connections closed when the worker stops."""

import asyncio
import os
import threading
import uuid

import pytest

from assistant import loop_redis
from assistant.services import admission
from assistant.services.admission import chat_admit, chat_slot_release
from assistant.services.stream_slots import RedisSlots, slot_store
from tests.support import REDIS_URL, redis_clients_named, thread_trips

OWNER = "session:loop-redis"

# A trip to a database thread checks that thread's connections before and after.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions a release sent to a database thread."""
    return thread_trips(monkeypatch, admission)


def loop_clients() -> int:
    """How many connections the loop's client has open, as Redis's ``CLIENT LIST`` names them."""
    return len(redis_clients_named(f"{loop_redis.LOOP_CLIENT_NAME}-{os.getpid()}"))


async def loop_clients_become(count: int) -> bool:
    """Whether Redis counts ``count`` of the loop's connections within 5 s (it sees a closed
    socket when it next reads it)."""
    for _ in range(100):
        if loop_clients() == count:
            return True
        await asyncio.sleep(0.05)
    return False


def held(request_id: str) -> tuple[str, ...]:
    """Who holds the session's one slot, as another question's try finds it (and gives back
    the slot it took, if it took one)."""
    tried = slot_store().take(OWNER, request_id, limit=1, ttl_s=60)
    if tried.taken:
        slot_store().release(OWNER, request_id)
    return tried.holders


async def test_a_servers_loop_gives_the_slot_back_itself_then_closes(
    redis_slots: RedisSlots, server_loop: None, hops: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A name of the test's own: an earlier test's loop may have left a connection open.
    monkeypatch.setattr(loop_redis, "LOOP_CLIENT_NAME", f"chatsite-loop-{uuid.uuid4().hex[:8]}")
    assert chat_admit(owner_key=OWNER, request_id="first").taken
    assert held("probe") == ("first",)
    await chat_slot_release(owner_key=OWNER, request_id="first")
    assert (held("probe"), hops) == ((), [])
    commands = loop_redis.loop_redis_commands(REDIS_URL)
    assert commands is not None
    assert commands.connected  # kept for the next answer
    assert loop_clients() == 1

    await loop_redis.loop_redis_close()
    assert not commands.connected
    assert await loop_clients_become(0)
    # A worker stopping after its client closed still gives slots back, through a thread.
    assert chat_admit(owner_key=OWNER, request_id="second").taken
    await chat_slot_release(owner_key=OWNER, request_id="second")
    assert (held("probe"), hops) == ((), ["chat_release"])
    assert loop_redis.loop_redis_commands(REDIS_URL) is None


async def test_a_loop_that_is_not_a_servers_goes_through_a_thread(
    redis_slots: RedisSlots, monkeypatch: pytest.MonkeyPatch, hops: list[str]
) -> None:
    """A management command or a test's own loop: no client is made, so none is left open."""
    monkeypatch.setattr(loop_redis, "_state", loop_redis._LoopClients())
    assert chat_admit(owner_key=OWNER, request_id="first").taken
    await chat_slot_release(owner_key=OWNER, request_id="first")
    assert (held("probe"), hops) == ((), ["chat_release"])
    assert loop_redis._state.clients == {}


async def test_only_the_first_loop_has_a_client(redis_slots: RedisSlots, server_loop: None) -> None:
    """A loop of its own in another thread (asgiref's, for one) gets none, and closes nothing."""
    mine = loop_redis.loop_redis_commands(REDIS_URL)
    found: list[object] = []

    def elsewhere() -> None:
        async def ask() -> None:
            found.append(loop_redis.loop_redis_commands(REDIS_URL))
            await loop_redis.loop_redis_close()

        asyncio.run(ask())

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert mine is not None and found == [None]
    assert loop_redis.loop_redis_commands(REDIS_URL) is mine  # not closed from the other loop
    await loop_redis.loop_redis_close()


async def test_slots_given_back_at_once_go_in_one_round_trip(
    redis_slots: RedisSlots, server_loop: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty answers ending together: one pipeline carries every give-back, where one command
    each would queue for the connection."""
    owners = [f"{OWNER}-{number}" for number in range(50)]
    for owner in owners:
        assert chat_admit(owner_key=owner, request_id="r").taken
    commands = loop_redis.loop_redis_commands(REDIS_URL)
    assert commands is not None
    await asyncio.gather(*(chat_slot_release(owner_key=o, request_id="r") for o in owners))
    assert (commands.batches, commands.commands) == (1, 50)
    assert all(slot_store().take(o, "again", limit=1, ttl_s=60).taken for o in owners)
    await loop_redis.loop_redis_close()


async def test_a_redis_out_of_reach_fails_each_command_of_the_batch() -> None:
    """Every command of a batch gets the connection's error (``chat_slot_release`` logs it; the
    slot frees itself after its time to live), and the next batch tries again."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    commands = loop_redis.LoopCommands("redis://127.0.0.1:1/0")
    replies = [commands.send("ZREM", "k", str(number)) for number in range(3)]
    found = await asyncio.gather(*replies, return_exceptions=True)
    assert [type(error).__name__ for error in found] == ["ConnectionError"] * 3
    with pytest.raises(RedisConnectionError):
        await commands.send("ZREM", "k", "again")
    await commands.close()
