"""Resuming an answer after a network drop.

Every stream's frames are kept, as they are sent, in a bounded per-stream buffer
(``ResumableStream``). When the client vanishes mid-answer the generation does not stop at once:
it goes on into the buffer for ``RESUME_GRACE_S`` seconds. A page that reconnects in time with
``Last-Event-ID`` (the id of the last token it rendered) gets ``: open``, ``meta`` again, exactly
the tokens after that id, and then the rest live; nobody reconnecting means the generation is
cancelled when the grace period ends, as it would have been at once without it. A finished
stream stays resumable for ``RESUME_KEEP_S`` seconds, so a drop just before ``done`` loses
nothing either.

On an engine that answers one student at a time (the embedded model), an answer nobody listens
to holds the engine only while nobody else waits for it: as soon as another request waits, the
grace ends and the answer stops, so a dropped or abandoned answer never delays another student.
On engines that batch (vLLM) the grace runs its course.

A student who presses Stop asks for it explicitly (``resumable_stop``): a dropped connection
looks the same as a closed one, so only that request ends the answer at once, wherever it runs.

Buffers live in this process's memory: a resume or a stop must reach the worker that runs the
stream (one worker by default; behind nginx, see docs/deploy.md). Only the stream's owner (the
same session or user) may resume or stop it.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from django.conf import settings

from assistant.services.frames import PING

logger = logging.getLogger(__name__)

#: Seconds between two looks, during a grace period, at whether another request waits.
CONTENDED_POLL_S = 0.1


def _token_id(frame: bytes) -> int | None:
    """The ``id:`` of a token frame (the encoder writes it first), None for other frames."""
    if not frame.startswith(b"id: "):
        return None
    return int(frame[4 : frame.index(b"\n")])


@dataclass(eq=False)
class ResumableStream:
    """One answer's frames, for whoever (re)attaches to it."""

    request_id: str
    owner_key: str
    #: Called when nobody listens any more and the grace period is over: stops the generation.
    stop: Callable[[], None]
    #: True while another request waits for this answer's engine (which runs one at a time).
    contended: Callable[[], bool] = lambda: False
    frames: list[bytes] = field(default_factory=list)
    size: int = 0
    finished: bool = False
    listeners: int = 0
    #: Bytes of frames the furthest listener has taken (yielded or skipped).
    delivered: int = 0
    #: Every listener went away (until one resumes). Before the first one comes, the response
    #: that opened the stream is about to listen.
    abandoned: bool = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _grace: asyncio.TimerHandle | None = None
    _poll: asyncio.TimerHandle | None = None
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)

    def append(self, frame: bytes) -> None:
        """Keep ``frame``. Past ``RESUME_MAX_BYTES`` nothing more is kept, and a later resume is
        refused: the answer is then in the database when it ends."""
        self.size += len(frame)
        if self.size <= settings.CHATSITE_STREAM["RESUME_MAX_BYTES"]:
            self.frames.append(frame)
        self._wake()

    def finish(self) -> None:
        """The stream has ended (done, error, or cancelled): keep it a little, then forget it."""
        if self.finished:
            return
        self.finished = True
        self._cancel_grace()
        if _live.get(self.request_id) is self:
            del _live[self.request_id]
        self._wake()
        keep = settings.CHATSITE_STREAM["RESUME_KEEP_S"]
        asyncio.get_running_loop().call_later(keep, self._forget)

    def _forget(self) -> None:
        key = (self.owner_key, self.request_id)
        if _registry.get(key) is self:  # a request id may be reused by a later stream
            del _registry[key]

    def unread(self) -> int:
        """Bytes produced that no listener has taken yet; 0 once every listener has gone (the
        answer then runs ahead on purpose, for a resume)."""
        return 0 if self.abandoned else self.size - self.delivered

    @property
    def complete(self) -> bool:
        """Every frame is still in the buffer."""
        return self.size <= settings.CHATSITE_STREAM["RESUME_MAX_BYTES"]

    def detach(self) -> None:
        """A listener went away. With nobody left and the answer still coming, the grace period
        starts: generation goes on until someone resumes or it runs out."""
        self.listeners -= 1
        if self.listeners > 0 or self.finished:
            return
        self.abandoned = True
        grace = settings.CHATSITE_STREAM["RESUME_GRACE_S"]
        self._cancel_grace()
        loop = asyncio.get_running_loop()
        self._grace = loop.call_later(max(grace, 0), self._expire)
        if grace > 0:
            self._poll = loop.call_later(CONTENDED_POLL_S, self._yield_if_contended)

    def _yield_if_contended(self) -> None:
        """During the grace: give the engine up at once when another request waits for it."""
        self._poll = None
        if self.listeners > 0 or self.finished or self._grace is None:
            return
        if self.contended():
            logger.info("Another request waits; stopping unheard %s", self.request_id)
            self._end_now(unheard_only=True)
            return
        self._poll = self._loop.call_later(CONTENDED_POLL_S, self._yield_if_contended)

    def attach(self) -> None:
        self.listeners += 1
        self.abandoned = False
        self._cancel_grace()

    def _expire(self) -> None:
        self._grace = None
        if self.listeners == 0 and not self.finished:
            logger.info("Nobody resumed %s in time; stopping it", self.request_id)
        self._end_now(unheard_only=True)

    def _preempted(self) -> None:
        self._end_now(unheard_only=True)

    def _stopped_by_owner(self) -> None:
        self._end_now(unheard_only=False)

    def _end_now(self, *, unheard_only: bool) -> None:
        """Stop the generation (``unheard_only``: only if nobody listens). From now on a resume
        gets the saved (partial) answer instead."""
        if self.finished or (unheard_only and self.listeners > 0):
            return
        self._cancel_grace()
        self._forget()
        self.stop()

    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def frames_after(self, last_id: int, ping_interval: float) -> AsyncIterator[bytes]:
        """``: open``, ``meta``, every frame after token ``last_id``, then new frames as they
        come (``: ping`` after ``ping_interval`` s of quiet) until the stream ends."""
        sent = taken = 0
        while True:
            while sent < len(self.frames):
                frame = self.frames[sent]
                sent += 1
                taken += len(frame)
                self.delivered = max(self.delivered, taken)
                token = _token_id(frame)
                if token is None or token > last_id:
                    yield frame
            if self.finished:
                return
            try:
                async with asyncio.timeout(ping_interval):
                    await self._changed.wait()
            except TimeoutError:
                yield PING

    async def listen(self, last_id: int, ping_interval: float) -> AsyncIterator[bytes]:
        """``frames_after`` for one more listener, who is counted until it goes away."""
        self.attach()
        try:
            async for frame in self.frames_after(last_id, ping_interval):
                yield frame
        finally:
            self.detach()


#: Streams that can be resumed, by (owner, request id): only while resuming is on.
_registry: dict[tuple[str, str], ResumableStream] = {}
#: Streams still running, by request id, whether resuming is on or not: for Stop, and so that
#: no two answers run under one id.
_live: dict[str, ResumableStream] = {}


def request_id_running(request_id: str) -> bool:
    """From any thread: whether an answer runs under ``request_id`` in this process, anybody's."""
    return request_id in _live


def resumable_stop(*, owner_key: str, request_id: str) -> bool:
    """From any thread: stop ``request_id`` at once if this process runs it for ``owner_key``,
    listened to or not (the student pressed Stop). What was said is stored as for any other
    early end. True when there was such an answer to stop."""
    stream = _live.get(request_id)
    if stream is None or stream.owner_key != owner_key or stream.finished:
        return False
    stream._loop.call_soon_threadsafe(stream._stopped_by_owner)
    return True


def resumable_preempt(*, owner_key: str, request_id: str) -> bool:
    """From any thread: stop ``request_id`` if this process runs it for ``owner_key`` and its
    listeners have all gone (its student moved on to a new question). True when it was stopped.

    A stream nobody has listened to yet is not abandoned: its response is about to (the
    ``django`` path's response starts reading only once the view has returned it)."""
    stream = _registry.get((owner_key, request_id))
    if stream is None or not stream.abandoned or stream.finished:
        return False
    stream._loop.call_soon_threadsafe(stream._preempted)
    return True


def resumable_open(
    *,
    request_id: str,
    owner_key: str,
    stop: Callable[[], None],
    contended: Callable[[], bool] = lambda: False,
) -> ResumableStream:
    """Start keeping ``request_id``'s frames. With resuming off (grace 0) nobody can resume it,
    and the answer stops as soon as its listener leaves; it can always be stopped."""
    stream = ResumableStream(
        request_id=request_id, owner_key=owner_key, stop=stop, contended=contended
    )
    _live[request_id] = stream
    if settings.CHATSITE_STREAM["RESUME_GRACE_S"] > 0:
        _registry[(owner_key, request_id)] = stream
    return stream


def resumable_find(*, request_id: str, owner_key: str) -> ResumableStream | None:
    """The stream to resume, if it is still kept, complete, and ``owner_key``'s."""
    stream = _registry.get((owner_key, request_id))
    if stream is None or not stream.complete:
        return None
    return stream
