"""Who may run the latency probe (``assistant/latency_probe.py``), and how many at once.

An operator's tool: staff, by their session, or a site key (an API key of no class: admins make
those). A class's key is refused, so a key handed to a class's tools cannot hold probes open.
Each caller runs at most ``MAX_PER_CALLER`` probes at once, and a process ``MAX_RUNNING``;
a key's probes also count against its rate.
"""

from dataclasses import dataclass, field

from assistant import errors
from assistant.db import run_db
from assistant.errors import Rejected
from assistant.services.api_keys import key_admitted, key_presented
from assistant.services.teaching import staff_of_session

MAX_RUNNING = 16
MAX_PER_CALLER = 4


@dataclass(slots=True)
class ProbeSeats:
    """This process's running probes, counted per caller."""

    running: int = 0
    by_caller: dict[str, int] = field(default_factory=dict)

    def take(self, caller: str) -> None:
        """Count one more probe of ``caller``; 503 ``probe_busy`` over either cap."""
        mine = self.by_caller.get(caller, 0)
        if self.running >= MAX_RUNNING or mine >= MAX_PER_CALLER:
            raise Rejected(errors.PROBE_BUSY, retry_after=5)
        self.running += 1
        self.by_caller[caller] = mine + 1

    def give_back(self, caller: str) -> None:
        self.running -= 1
        left = self.by_caller.pop(caller) - 1
        if left:
            self.by_caller[caller] = left


SEATS = ProbeSeats()


async def probe_admit(
    *, authorization: str | None, session_key: str | None, request_id: str
) -> str:
    """Who runs this probe (an owner key), or ``Rejected``: 401 with neither a key nor a
    session, 401/429 for a key that is not valid or over its rate, 403 for a class's key or a
    session that is not staff."""
    if authorization is not None:
        presented = key_presented(authorization)
        identity, _slot, _refusals = await run_db(key_admitted, presented, request_id)
        if identity.classroom is not None:
            raise Rejected(errors.PROBE_FORBIDDEN)
        return identity.owner_key
    if session_key is None:
        raise Rejected(errors.PROBE_LOGIN)
    caller = await run_db(staff_of_session, session_key)
    if caller is None:
        raise Rejected(errors.PROBE_FORBIDDEN)
    return caller
