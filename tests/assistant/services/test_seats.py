"""Who gets a seat on a full engine, and whose answer gives one up: the pure verdict, then the
seating that acts on it."""

from collections.abc import Callable

import pytest

from assistant.engines import EngineBusy
from assistant.engines.scripted import ScriptedEngine
from assistant.errors import Rejected
from assistant.services.seats import FAIR_SHARE, UNHEARD, Seat, Seating, seat_verdict


def seats(*clients: str, unheard: Callable[[int], bool] = lambda i: False) -> list[Seat]:
    made = []
    for i, client in enumerate(clients):
        seat = Seat(client=client)
        seat.unheard = lambda i=i: unheard(i)  # type: ignore[misc]
        made.append(seat)
    return made


def test_below_the_caps_everyone_is_seated() -> None:
    verdict = seat_verdict(seats("a", "b"), "c", cap=3, per_client=2)
    assert verdict.free is None and not verdict.refuse


def test_at_the_cap_an_unheard_answer_goes_first_the_oldest() -> None:
    held = seats("a", "b", "a", "b", unheard=lambda i: i in (1, 3))
    verdict = seat_verdict(held, "c", cap=4, per_client=0)
    assert (verdict.free, verdict.reason) == (held[1], UNHEARD)


def test_then_the_heaviest_address_loses_its_newest_answer() -> None:
    held = seats("flood", "flood", "student", "flood", "flood")
    verdict = seat_verdict(held, "newcomer", cap=5, per_client=0)
    assert (verdict.free, verdict.reason) == (held[4], FAIR_SHARE)


def test_nobody_is_stopped_for_an_address_already_holding_its_share() -> None:
    # Four addresses on four seats: each holds exactly its share, the newcomer waits.
    verdict = seat_verdict(seats("a", "b", "c", "d"), "e", cap=4, per_client=0)
    assert verdict.refuse == "engine_busy" and verdict.free is None
    # The heaviest is the newcomer itself: it cannot push anyone out.
    verdict = seat_verdict(seats("flood", "flood", "flood", "b"), "flood", cap=4, per_client=0)
    assert verdict.refuse == "engine_busy"
    # One seat more than the newcomer is no reason to swap one for the other.
    verdict = seat_verdict(seats("a", "a", "b", "b"), "b", cap=4, per_client=0)
    assert verdict.refuse == "engine_busy"


def test_a_request_not_yet_known_takes_nobodys_seat() -> None:
    held = seats("flood", "flood", "flood", unheard=lambda i: i == 0)
    verdict = seat_verdict(held, "newcomer", cap=3, per_client=0, evict=False)
    assert verdict.refuse == "engine_busy" and verdict.free is None


def test_an_address_at_its_limit_gives_up_only_its_own_unheard_answer() -> None:
    held = seats("other", "nat", "nat", unheard=lambda i: i in (0, 2))
    verdict = seat_verdict(held, "nat", cap=0, per_client=2)
    assert (verdict.free, verdict.reason) == (held[2], UNHEARD)
    heard = seats("other", "nat", "nat", unheard=lambda i: i == 0)
    assert seat_verdict(heard, "nat", cap=0, per_client=2).refuse == "address_busy"


def test_the_seating_frees_the_seat_and_tells_its_answer_why() -> None:
    engine = ScriptedEngine("default", {"MAX_STREAMS": 2})
    seating = Seating(engine)
    told: list[str] = []
    first = seating.take("flood", evict=False)
    second = seating.take("flood", evict=False)
    second.give_up = told.append
    with pytest.raises(EngineBusy):
        seating.take("student", evict=False)
    student = seating.take("student", evict=True)
    assert told == [FAIR_SHARE]
    assert seating.seats == [first, student]
    second.leave()  # the given-up answer ends later: its seat is gone already
    assert seating.seats == [first, student]
    student.leave()
    assert seating.seats == [first]


def test_the_address_limit_refuses_with_429(settings) -> None:
    settings.CHATSITE_CLIENTS = {**settings.CHATSITE_CLIENTS, "STREAMS_PER_ADDRESS": 1}
    seating = Seating(ScriptedEngine("default", {"MAX_STREAMS": 0}))
    seating.take("nat", evict=True)
    with pytest.raises(Rejected) as refused:
        seating.take("nat", evict=True)
    assert (refused.value.error.status, refused.value.error.code) == (429, "address_busy")
    assert refused.value.retry_after == 5
