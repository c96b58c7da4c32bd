"""The embedded model as the web workers see it: a client of the host's model process.

The model runs in its own process (``python -m assistant.modelhost``), one per host, shared by
every worker: one copy of the weights, one line of students for the whole host, and a crash in
native code that ends that process, never a worker. Each answer is one connection to its Unix
socket (``assistant/modelhost/protocol.py``); closing it cancels the answer there at once.

A connection that ends mid-answer means the model process died: the stream fails with
``engine_crashed`` (what was said so far is kept by the caller, as for any engine failure), and
the supervisor restarts it. While it is known to be down this engine refuses new requests before
their response starts (503), and asks it again in a thread at most every ``RECHECK_S``.
"""

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from assistant.modelhost import protocol
from assistant.modelhost.protocol import End, Failure, HostStatus, Waiting

from .base import BaseEngine, ChatMessage, Delta, EngineError, EngineUnavailable, GenerationParams
from .llamacpp import LlamaCppEngine

#: Seconds a "down" status stands before ``check`` asks the model process again.
RECHECK_S = 0.5
#: Seconds a status question may take (the supervisor answers at once; a loading model
#: process leaves it in the backlog).
STATUS_TIMEOUT_S = 0.25

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

NOT_RUNNING = (
    "The model process is not running at {path} (start it with `python -m assistant.modelhost`; "
    "./scripts/run and deploy/systemd/chatsite-model.service do)."
)


class ModelProcessEngine(BaseEngine):
    name = "llamacpp"
    #: Sampled by the model process with the embedded engine's own defaults.
    default_generation = LlamaCppEngine.default_generation

    def __init__(self, alias: str, options: dict[str, Any]) -> None:
        super().__init__(alias, options)
        self.socket_path = Path(options.get("SOCKET") or protocol.default_socket_path())
        #: What the model process last said about itself, and when (monotonic).
        self.status: HostStatus | None = None
        self._status_at = 0.0
        #: Other requests the model process holds, as it last told one of ours.
        self._others = 0
        self._open = 0
        self._refreshing: asyncio.Task[None] | None = None

    def _note(self, status: HostStatus) -> None:
        self.status, self._status_at = status, time.monotonic()

    def _unavailable(self, status: HostStatus) -> EngineUnavailable:
        return EngineUnavailable(
            status.message or "The model process is restarting.",
            code=status.code or "engine_restarting",
        )

    def _not_running(self) -> EngineUnavailable:
        """Nothing serves the socket: noted as down, and the error to raise."""
        status = HostStatus(
            state="down",
            code="model_process_down",
            message=NOT_RUNNING.format(path=self.socket_path),
        )
        self._note(status)
        return self._unavailable(status)

    def status_fetch(self) -> HostStatus:
        """Ask the model process how it is (blocking, bounded by ``STATUS_TIMEOUT_S``).

        ``starting`` when it does not answer in time: the model is loading. Raises
        ``EngineUnavailable`` when nothing serves the socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(STATUS_TIMEOUT_S)
            try:
                sock.connect(str(self.socket_path))
                sock.sendall(protocol.STATUS_REQUEST)
                line = sock.makefile("rb").readline(protocol.MAX_LINE_BYTES)
            except TimeoutError:
                status = HostStatus(state="starting")
            except OSError as exc:
                raise self._not_running() from exc
            else:
                try:
                    reply = protocol.reply_parse(line) if line.endswith(b"\n") else None
                except protocol.ProtocolError:
                    reply = None
                if not isinstance(reply, HostStatus):
                    reply = HostStatus(state="starting")
                status = reply
        self._note(status)
        return status

    def load(self) -> None:
        """Nothing to load here: the model process holds the model. Reports (raises) when it
        cannot serve, so the worker's log says so at start."""
        status = self.status_fetch()
        if status.state == "down":
            raise self._unavailable(status)

    def check(self) -> None:
        """Refuses while the model process is known to be down, without waiting on it: once
        that news is ``RECHECK_S`` old, a thread asks again for the requests after this one."""
        status = self.status
        if status is None or status.state != "down":
            return
        if time.monotonic() - self._status_at >= RECHECK_S:
            self._refresh_soon()
        raise self._unavailable(status)

    def _refresh_soon(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            return

        def fetch() -> None:
            with contextlib.suppress(EngineUnavailable):  # noted as down by status_fetch
                self.status_fetch()

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a management command): nothing to hold up
            fetch()
            return
        self._refreshing = loop.create_task(asyncio.to_thread(fetch))

    async def ready(self) -> None:
        status = await asyncio.to_thread(self.status_fetch)
        if status.state != "up":
            raise EngineUnavailable(
                status.message or f"model process {status.state}",
                code=status.code or f"model_process_{status.state}",
            )

    def queue_depth(self) -> int:
        """Other requests the model process holds: the one it decodes answers alone, so for
        an answer of ours any other is waiting, or waited on."""
        return self._others

    async def _connect(self) -> Connection:
        try:
            return await asyncio.open_unix_connection(
                str(self.socket_path), limit=protocol.MAX_LINE_BYTES
            )
        except OSError as exc:
            raise self._not_running() from exc

    @staticmethod
    async def _reply(reader: asyncio.StreamReader) -> protocol.Reply:
        """The next line from the model process; ``engine_crashed`` when the connection ends
        without one (or mid-line: it died while writing), ``bad_reply`` for a line that does
        not parse."""
        try:
            line = await reader.readline()
        except ConnectionError:
            line = b""
        except ValueError as exc:  # longer than MAX_LINE_BYTES
            raise EngineError(f"The model process sent {exc}", code="bad_reply") from None
        if not line.endswith(b"\n"):
            raise EngineError("The model process ended during this answer.", code="engine_crashed")
        try:
            return protocol.reply_parse(line)
        except protocol.ProtocolError as exc:
            raise EngineError(str(exc), code="bad_reply") from None

    async def _open_request(self, request: bytes) -> tuple[Connection, HostStatus]:
        """A connection with ``request`` sent and the model process's hello read."""
        reader, writer = await self._connect()
        try:
            writer.write(request)
            hello = await self._reply(reader)
            if not isinstance(hello, HostStatus):  # a failure: a request it could not read
                failure = hello if isinstance(hello, Failure) else Failure("bad_reply", "")
                raise EngineUnavailable(failure.message, code=failure.code)
        except BaseException:  # including a timeout while it waits in the backlog
            writer.transport.abort()
            raise
        return (reader, writer), hello

    async def stream(
        self, messages: Sequence[ChatMessage], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        request = protocol.generate_request(messages, params)
        (reader, writer), hello = await self._open_request(request)
        self._note(hello)
        if hello.state == "down":
            writer.transport.abort()
            raise self._unavailable(hello)
        self._open += 1
        try:
            while True:
                reply = await self._reply(reader)
                if isinstance(reply, Delta):
                    yield reply
                elif isinstance(reply, Waiting):
                    self._others = reply.others
                elif isinstance(reply, Failure):
                    error = EngineError if reply.started else EngineUnavailable
                    raise error(reply.message, code=reply.code)
                elif isinstance(reply, End):
                    return
        finally:
            self._open -= 1
            if not self._open:
                self._others = 0
            writer.transport.abort()  # the model process cancels this request on the close

    def describe(self) -> dict[str, Any] | None:
        """The model process's status for the dashboard (asks it, bounded)."""
        try:
            status = self.status_fetch()
        except EngineUnavailable:
            status = self.status or HostStatus(state="down")
        described = asdict(status)
        for name in ("since", "last_exit_at"):
            if described[name]:
                described[name] = datetime.fromtimestamp(described[name], UTC).isoformat()
        return described
