"""The model process: one engine, loaded once, serving every web worker of the host.

Started by the supervisor (``supervisor.py``) with the listening socket already bound, so a
request that arrives while this process loads, or while it restarts after a crash, waits in the
socket's backlog instead of being refused. It loads the engine first, tells the supervisor it is
ready (one JSON line on the status pipe), then accepts. Each connection is one request: the
engine's deltas go out as they come; a connection that closes cancels its request at once (a
request still waiting leaves the line, a decoding one stops at the next token).

Native code may fault here (a segfault, an abort, the OOM killer): that ends only this process.
Its connections close with it, every worker reports ``engine_crashed`` to its students, and the
supervisor starts a new one.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from contextlib import aclosing
from typing import Any

from django.utils.module_loading import import_string

from assistant.engines.base import BaseEngine, EngineError, EngineUnavailable

from . import protocol
from .protocol import Failure, HostStatus

logger = logging.getLogger("chatsite.modelhost")

#: Exit status of a model process whose engine cannot load (a missing or corrupt model file):
#: the supervisor then reports the engine's own code instead of a crash.
EXIT_UNAVAILABLE = 3
#: Seconds a connection may take to send its request line.
REQUEST_TIMEOUT_S = 10.0


class Runner:
    def __init__(self, engine: BaseEngine, *, restarts: int, last_exit: str | None,
                 last_exit_at: float | None) -> None:  # fmt: skip
        self.engine = engine
        self.restarts = restarts
        self.last_exit = last_exit
        self.last_exit_at = last_exit_at
        self.since = time.time()
        #: Each generation's connection, and the count of others it was last told.
        self.sessions: dict[asyncio.StreamWriter, int] = {}

    def status(self) -> HostStatus:
        return HostStatus(
            state="up",
            pid=os.getpid(),
            restarts=self.restarts,
            since=self.since,
            last_exit=self.last_exit,
            last_exit_at=self.last_exit_at,
            active=len(self.sessions),
            engine=self.engine.name,
        )

    def _tell_waiting(self) -> None:
        """Tell every request how many others the process holds: the decoding one learns
        that somebody waits, which an answer nobody listens to yields to."""
        others = max(0, len(self.sessions) - 1)
        line = protocol.waiting_line(others)
        for writer, told in self.sessions.items():
            if told != others:
                self.sessions[writer] = others
                writer.write(line)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    line = await reader.readline()
                request = protocol.request_parse(line)
            except TimeoutError:
                return  # connected and said nothing: not a worker's request
            except (protocol.ProtocolError, ValueError) as exc:  # ValueError: line too long
                writer.write(protocol.failure_line(Failure("bad_request", str(exc))))
                return
            writer.write(protocol.hello_line(self.status()))
            if request.op == "generate":
                await self._generate(request, reader, writer)
        except ConnectionError:
            pass  # the worker went away: nothing to tell anybody
        finally:
            writer.close()

    async def _generate(
        self, request: protocol.Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        closed_by_worker = False

        async def cancel_on_close() -> None:
            nonlocal closed_by_worker
            # b"" once the worker closes (it sends nothing else); a reset if it closed with
            # a line of ours still unread.
            with contextlib.suppress(OSError):  # ConnectionResetError among them
                await reader.read(1)
            closed_by_worker = True
            task.cancel()

        watcher = asyncio.create_task(cancel_on_close())
        self.sessions[writer] = 0
        self._tell_waiting()
        started = False
        try:
            deltas = self.engine.stream(request.messages, request.params)
            async with aclosing(deltas):  # type: ignore[type-var]
                async for delta in deltas:
                    started = started or bool(delta.text)
                    writer.write(protocol.delta_line(delta))
                    await writer.drain()
            writer.write(protocol.END)
        except asyncio.CancelledError:
            if not closed_by_worker:
                raise  # the process is stopping
            task.uncancel()  # the worker closed the connection: its request ends here
        except EngineError as exc:
            writer.write(protocol.failure_line(Failure(exc.code, str(exc), started=started)))
        finally:
            watcher.cancel()
            self.sessions.pop(writer, None)
            self._tell_waiting()


def _build(backend: str, options: dict[str, Any]) -> BaseEngine:
    engine: BaseEngine = import_string(backend)("modelhost", options)
    # The host admits everything it is sent: each worker caps its own streams, and a request
    # over the engine's pace waits in its line.
    engine.max_streams = 0
    return engine


async def _main(args: argparse.Namespace) -> None:
    listener = socket.socket(fileno=args.fd)
    status_pipe = os.fdopen(args.status_fd, "w", buffering=1)
    try:
        engine = _build(args.backend, json.loads(args.options))
        await asyncio.to_thread(engine.load)
    except Exception as exc:  # the model is missing, corrupt, or llama.cpp does not import
        code = exc.code if isinstance(exc, EngineUnavailable) else "model_load_failed"
        logger.error("The engine cannot load: %s", exc)
        status_pipe.write(json.dumps({"code": code, "message": str(exc)}) + "\n")
        raise SystemExit(EXIT_UNAVAILABLE) from None
    runner = Runner(
        engine,
        restarts=args.restarts,
        last_exit=args.last_exit or None,
        last_exit_at=args.last_exit_at or None,
    )
    server = await asyncio.start_unix_server(
        runner.serve, sock=listener, limit=protocol.MAX_LINE_BYTES
    )
    status_pipe.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    status_pipe.close()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Not `async with server`: waiting for every connection to close would wait for the
    # workers' idle ones. asyncio.run cancels the requests still open.
    server.close()
    with contextlib.suppress(Exception):
        await engine.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description="chatsite's model process (the supervisor's)")
    parser.add_argument("--fd", type=int, required=True, help="the bound, listening socket")
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--restarts", type=int, default=0)
    parser.add_argument("--last-exit", default="")
    parser.add_argument("--last-exit-at", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s model[%(process)d] %(message)s")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
