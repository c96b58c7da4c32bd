"""Why an answer ends before its engine is done, and what its listeners are told then.

Every early end is one value handed to the answer's frame loop (``Answer._end_early``), which
acts on it at its next step: the outcome it is recorded with, its code, and the message of the
``error`` event that closes the stream.
"""

from dataclasses import dataclass

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from assistant import errors
from assistant.models import StreamRecord

Outcome = StreamRecord.Outcome


@dataclass(frozen=True, slots=True)
class EarlyEnd:
    """Why an answer must end before the engine is done, and what its listeners are told."""

    outcome: Outcome
    code: str
    #: The last frame's message (lazy: in the asker's language); "" ends the stream without an
    #: ``error`` event.
    message: str | Promise = ""


STOPPED = EarlyEnd(Outcome.CLIENT_ABORT, "")
SLOW_CLIENT = EarlyEnd(
    Outcome.SLOW_CLIENT, "slow_client", _("The connection could not keep up with the answer.")
)


class Ended(Exception):
    """Raised in the frame loop to end it with ``end``."""

    def __init__(self, end: EarlyEnd) -> None:
        super().__init__(end.code)
        self.end = end


def given_up(reason: str) -> EarlyEnd:
    """The answer's seat went to another request (``seats.UNHEARD``, ``seats.FAIR_SHARE``)."""
    return EarlyEnd(Outcome.GIVEN_UP, reason, errors.GIVEN_UP[reason].message)
