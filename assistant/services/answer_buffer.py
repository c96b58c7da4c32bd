"""An answer's frames, kept for whoever (re)attaches to it, and its grace period.

Every frame of an answer is kept, as it is produced, as a ``(token id, frame)`` pair in a
bounded buffer. When every listener has gone mid-answer the generation does not stop at once: it
goes on into the buffer for ``RESUME_GRACE_S`` seconds. A page that reconnects in time with
``Last-Event-ID`` (the id of the last token it rendered) gets ``: open``, ``meta`` again, exactly
the tokens after that id, and then the rest live; nobody reconnecting means the answer is ended
when the grace period ends, as it would have been at once without it. A finished answer stays
resumable for ``RESUME_KEEP_S`` seconds, so a drop just before ``done`` loses nothing either.

On an engine that answers one student at a time (the embedded model), an answer nobody listens
to holds the engine only while nobody else waits for it: as soon as another request waits, the
grace ends and the answer stops, so a dropped or abandoned answer never delays another student.
On engines that batch (vLLM) the grace runs its course.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from django.conf import settings

from assistant import conf
from assistant.services.frames import PING

logger = logging.getLogger(__name__)

#: Seconds between two looks, during a grace period, at whether another request waits.
CONTENDED_POLL_S = 0.1


#: A frame kept for a resume, after the id of the token it carries (None: not a token's).
Frame = tuple[int | None, bytes]


def resumed(token_id: int | None, last_id: int) -> bool:
    """Whether a resume from token ``last_id`` gets the frame of ``token_id``: every frame but
    the tokens up to it."""
    return token_id is None or token_id > last_id


def _nothing() -> None:
    """An ended answer has nothing left to stop."""


def _never() -> bool:
    return False


@dataclass(eq=False)
class AnswerBuffer:
    """One answer's frames and who listens to them; owned by its ``Answer``."""

    request_id: str
    #: Called when nobody listens any more and the grace period is over, or when another
    #: request waits for the engine meanwhile: ends the answer if still nobody listens.
    unheard: Callable[[], None]
    #: True while another request waits for this answer's engine (which runs one at a time).
    contended: Callable[[], bool]
    frames: list[Frame] = field(default_factory=list)
    size: int = 0
    finished: bool = False
    listeners: int = 0
    #: Bytes of frames the furthest listener has taken (sent, yielded or skipped).
    delivered: int = 0
    #: Every listener went away (until one resumes). Before the first one comes, the response
    #: that opened the answer is about to listen.
    abandoned: bool = False
    #: ``RESUME_MAX_BYTES`` when the answer began (read once, not at every frame).
    max_bytes: int = field(
        default_factory=lambda: conf.settings.CHATSITE_STREAM["RESUME_MAX_BYTES"]
    )
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: Listeners waiting on ``_changed`` now: with none, a new frame wakes nobody.
    _waiting: int = 0
    _grace: asyncio.TimerHandle | None = None
    _poll: asyncio.TimerHandle | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)

    def keep(self, token_id: int | None, frame: bytes) -> None:
        """Keep ``frame``. Past ``RESUME_MAX_BYTES`` nothing more is kept, and a later resume is
        refused: the answer is then in the database when it ends."""
        self.size += len(frame)
        if self.size <= self.max_bytes:
            self.frames.append((token_id, frame))
        self._wake()

    def finish(self) -> None:
        """The answer has ended (done, error, or stopped): wake every listener to see it."""
        if self.finished:
            return
        self.finished = True
        self.cancel_grace()
        # Its answer's callbacks are not needed any more: hold no cycle back to it.
        self.unheard, self.contended = _nothing, _never
        self._wake()

    def unread(self) -> int:
        """Bytes produced that no listener has taken yet; 0 once every listener has gone (the
        answer then runs ahead on purpose, for a resume)."""
        return 0 if self.abandoned else self.size - self.delivered

    @property
    def complete(self) -> bool:
        """Every frame is still in the buffer."""
        return self.size <= self.max_bytes

    def attach(self) -> None:
        self.listeners += 1
        self.abandoned = False
        self.cancel_grace()

    def detach(self) -> None:
        """A listener went away. With nobody left and the answer still coming, the grace period
        starts: generation goes on until someone resumes or it runs out."""
        self.listeners -= 1
        if self.listeners > 0 or self.finished:
            return
        self.abandoned = True
        grace = settings.CHATSITE_STREAM["RESUME_GRACE_S"]
        self.cancel_grace()
        self._grace = self.loop.call_later(max(grace, 0), self._expire)
        if grace > 0:
            self._poll = self.loop.call_later(CONTENDED_POLL_S, self._yield_if_contended)

    def _yield_if_contended(self) -> None:
        """During the grace: give the engine up at once when another request waits for it."""
        self._poll = None
        if self.listeners > 0 or self.finished or self._grace is None:
            return
        if self.contended():
            logger.info("Another request waits; stopping unheard %s", self.request_id)
            self.unheard()
            return
        self._poll = self.loop.call_later(CONTENDED_POLL_S, self._yield_if_contended)

    def _expire(self) -> None:
        self._grace = None
        if self.listeners == 0 and not self.finished:
            logger.info("Nobody resumed %s in time; stopping it", self.request_id)
        self.unheard()

    def cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None

    def _wake(self) -> None:
        if self._waiting:
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def sent(self) -> None:
        """Every frame kept so far has been taken by a listener."""
        self.delivered = self.size

    async def frames_after(self, last_id: int, ping_interval: float) -> AsyncIterator[bytes]:
        """Every frame but the tokens up to ``last_id``, then new frames as they come
        (``: ping`` after ``ping_interval`` s of quiet) until the answer ends."""
        sent = taken = 0
        while True:
            while sent < len(self.frames):
                token_id, frame = self.frames[sent]
                sent += 1
                taken += len(frame)
                self.delivered = max(self.delivered, taken)
                if resumed(token_id, last_id):
                    yield frame
            if self.finished:
                return
            self._waiting += 1
            try:
                async with asyncio.timeout(ping_interval):
                    await self._changed.wait()
                quiet = False
            except TimeoutError:
                quiet = True
            finally:
                self._waiting -= 1
            if quiet:
                yield PING
