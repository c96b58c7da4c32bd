"""The whole path with the real embedded model: Daphne, the consumer, llama.cpp, SmolLM2."""

import pytest

from assistant.models import Message
from tests.support import ChatClient, LiveServer, wait_for

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def model_server(daphne_factory) -> LiveServer:
    return daphne_factory(CHATSITE_ENGINE="llamacpp", CHATSITE_MAX_TOKENS="48")


def test_a_real_answer_streams_token_by_token(model_server: LiveServer, transactional_db) -> None:
    client = ChatClient(model_server)
    try:
        events = client.ask("What is photosynthesis? Answer in one sentence.")
    finally:
        client.close()
    kinds = [e.event for e in events]
    assert kinds[0] == "meta" and kinds[-1] == "done", kinds
    assert events[0].json()["engine"] == "llamacpp"
    tokens = [e for e in events if e.event == "token"]
    assert len(tokens) >= 5
    # Streamed, not delivered at the end: most tokens arrive in a read of their own.
    assert len({round(e.at, 3) for e in tokens}) >= len(tokens) // 2
    text = "".join(e.json()["text"] for e in tokens)
    assert len(text.split()) >= 3
    done = events[-1].json()
    assert done["tokens"] == len(tokens)
    assert done["finish_reason"] in {"stop", "length"}
    assert done["timings"]["engine_ttft"] > 0
    answer = wait_for(lambda: Message.objects.filter(id=events[0].json()["message"]).first())
    assert answer.content == text
    assert answer.status == "complete"


def test_a_waiting_student_is_told_their_place_in_line(
    model_server: LiveServer, transactional_db
) -> None:
    """The embedded model answers one student at a time; the one who waits hears they are next,
    before their first word."""
    from concurrent.futures import ThreadPoolExecutor

    first, second = ChatClient(model_server), ChatClient(model_server)
    try:
        with ThreadPoolExecutor(2) as pool:
            answers = [
                pool.submit(first.ask, "Tell me a long story about a dragon."),
                pool.submit(second.ask, "Tell me a long story about a castle."),
            ]
            both = [answer.result() for answer in answers]
    finally:
        first.close()
        second.close()
    for events in both:
        kinds = [e.event for e in events]
        assert kinds[0] == "meta" and kinds[-1] == "done", kinds
    # Whichever reached the model second waited for the other's whole answer.
    waited = [events for events in both if any(e.event == "queue" for e in events)]
    assert len(waited) == 1, [[e.event for e in events][:4] for events in both]
    kinds = [e.event for e in waited[0]]
    assert [e.json()["position"] for e in waited[0] if e.event == "queue"] == [1]
    assert kinds.index("queue") < kinds.index("token")
