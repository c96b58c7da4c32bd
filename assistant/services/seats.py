"""Who may stream on an engine: its seats in this process, and who gives one up when it is full.

Every answer holds one seat from the moment its engine is asked until it ends. An engine has
``MAX_STREAMS`` seats (per process), and one client address at most ``STREAMS_PER_ADDRESS`` of
them. When a request finds no seat free (``seat_verdict``, pure):

1. an answer nobody listens to any more (its page went away; it would only run on for a resume)
   is given up first, the oldest first; at the address's own limit, only one of its own;
2. else, at the engine's cap, the address holding the most seats gives up its newest, if it holds
   more than its fair share (the cap split evenly between the addresses streaming, the newcomer
   included) and at least two more than the newcomer;
3. else the request is refused: 429 ``address_busy`` at the address's limit, 503 ``engine_busy``
   at the engine's cap.

Giving a seat up frees it at once; the answer ends with an ``error`` event saying why, and what
it said so far is stored. Only a request whose session is known may take a seat from another
(``evict=True``): a request with a forged cookie must not stop anybody's answer.
"""

import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from assistant import conf, errors, metrics
from assistant.engines import BaseEngine, EngineBusy
from assistant.errors import Rejected

#: What an address at its limit is told to wait.
ADDRESS_RETRY_AFTER_S = 5

UNHEARD = "unheard"
FAIR_SHARE = "fair_share"


def _never() -> bool:
    return False


def _ignore(reason: str) -> None:
    """A seat whose answer has not started yet has nothing to stop."""


@dataclass(eq=False, slots=True)
class Seat:
    """One answer's place on an engine."""

    client: str
    #: True while nobody listens to the answer (set once the answer runs).
    unheard: Callable[[], bool] = _never
    #: Ends the answer early, telling its listener why (set once the answer runs).
    give_up: Callable[[str], None] = _ignore
    seating: "Seating | None" = None

    def leave(self) -> None:
        """Free the seat (once), and let go of the answer: no reference cycle outlives it, so
        the answer is freed at once rather than by the garbage collector's pauses."""
        seating, self.seating = self.seating, None
        self.unheard, self.give_up = _never, _ignore
        if seating is not None:
            seating.remove(self)


@dataclass(frozen=True, slots=True)
class Verdict:
    #: The seat to give up for the newcomer, and why (``UNHEARD``, ``FAIR_SHARE``).
    free: Seat | None = None
    reason: str = ""
    #: Why the newcomer is refused instead ("address_busy", "engine_busy"); "" admits it.
    refuse: str = ""


def seat_verdict(
    seats: Sequence[Seat], client: str, *, cap: int, per_client: int, evict: bool = True
) -> Verdict:
    """Whether ``client`` may have one more of ``seats`` (oldest first), and at whose cost."""
    mine = [seat for seat in seats if seat.client == client]
    if per_client and len(mine) >= per_client:
        own = next((seat for seat in mine if seat.unheard()), None) if evict else None
        if own is not None:
            return Verdict(free=own, reason=UNHEARD)
        return Verdict(refuse=errors.ADDRESS_BUSY.code)
    if not cap or len(seats) < cap:
        return Verdict()
    if not evict:
        return Verdict(refuse=errors.ENGINE_BUSY.code)
    unheard = next((seat for seat in seats if seat.unheard()), None)
    if unheard is not None:
        return Verdict(free=unheard, reason=UNHEARD)
    held = Counter(seat.client for seat in seats)
    addresses = len(held) + (client not in held)
    heaviest, most = held.most_common(1)[0]
    if heaviest != client and most > cap / addresses and most >= len(mine) + 2:
        newest = next(seat for seat in reversed(seats) if seat.client == heaviest)
        return Verdict(free=newest, reason=FAIR_SHARE)
    return Verdict(refuse=errors.ENGINE_BUSY.code)


@dataclass(eq=False)
class Seating:
    """One engine's seats in this process, oldest first."""

    engine: BaseEngine
    seats: list[Seat] = field(default_factory=list)

    def take(self, client: str, *, evict: bool) -> Seat:
        """A seat for ``client``, freeing another's when the verdict says so.

        Raises ``Rejected`` (429 ``address_busy``) or ``EngineBusy`` (503) when refused.
        """
        verdict = seat_verdict(
            self.seats,
            client,
            cap=self.engine.max_streams,
            per_client=conf.settings.CHATSITE_CLIENTS["STREAMS_PER_ADDRESS"],
            evict=evict,
        )
        if verdict.refuse == errors.ADDRESS_BUSY.code:
            raise Rejected(errors.ADDRESS_BUSY, retry_after=ADDRESS_RETRY_AFTER_S)
        if verdict.refuse:
            raise EngineBusy(f"{len(self.seats)} streams already running on {self.engine.alias!r}")
        if verdict.free is not None:
            metrics.STREAMS_GIVEN_UP.labels(reason=verdict.reason).inc()
            give_up = verdict.free.give_up
            verdict.free.leave()
            give_up(verdict.reason)
        seat = Seat(client=client, seating=self)
        self.seats.append(seat)
        return seat

    def remove(self, seat: Seat) -> None:
        self.seats.remove(seat)


_seatings: "weakref.WeakKeyDictionary[BaseEngine, Seating]" = weakref.WeakKeyDictionary()


def seating_for(engine: BaseEngine) -> Seating:
    seating = _seatings.get(engine)
    if seating is None:
        seating = _seatings[engine] = Seating(engine)
    return seating
