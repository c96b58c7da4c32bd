"""The event loop a worker runs on (chatsite/event_loop.py): uvloop unless told otherwise."""

import asyncio

import pytest

from assistant.benchmarking.servers import LiveServer
from chatsite.event_loop import event_loop_install, event_loop_name, event_loop_wanted
from tests.support import ChatClient, wait_for


def test_the_wanted_loop_is_uvloop_unless_asyncio_is_named(monkeypatch) -> None:
    monkeypatch.delenv("CHATSITE_EVENT_LOOP", raising=False)
    assert event_loop_wanted() == "uvloop"
    monkeypatch.setenv("CHATSITE_EVENT_LOOP", " AsyncIO ")
    assert event_loop_wanted() == "asyncio"
    monkeypatch.setenv("CHATSITE_EVENT_LOOP", "tokio")
    with pytest.raises(ValueError, match="CHATSITE_EVENT_LOOP must be one of uvloop, asyncio"):
        event_loop_wanted()


def test_installing_uvloop_makes_new_loops_uvloop(monkeypatch) -> None:
    before = asyncio.get_event_loop_policy()
    try:
        monkeypatch.setenv("CHATSITE_EVENT_LOOP", "uvloop")
        assert event_loop_install() == "uvloop"
        loop = asyncio.new_event_loop()
        assert event_loop_name(loop) == "uvloop"
        loop.close()
        asyncio.set_event_loop_policy(None)
        monkeypatch.setenv("CHATSITE_EVENT_LOOP", "asyncio")
        assert event_loop_install() == "asyncio"
        loop = asyncio.new_event_loop()
        assert event_loop_name(loop) == "asyncio"
        loop.close()
    finally:
        asyncio.set_event_loop_policy(before)


def answered(server: LiveServer) -> None:
    """A whole answer from ``server``, through its chat stream."""
    client = ChatClient(server)
    try:
        events = client.ask("Hello?")
    finally:
        client.close()
    assert [e.event for e in events if e.event != "token"] == ["meta", "done"]
    assert sum(e.event == "token" for e in events) > 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wanted", ["uvloop", "asyncio"])
def test_a_worker_serves_on_the_loop_it_was_given(daphne_factory, wanted: str) -> None:
    server = daphne_factory(CHATSITE_EVENT_LOOP=wanted)
    wait_for(lambda: f"Event loop: {wanted}" in server.log())
    answered(server)
    assert "Traceback" not in server.log()
