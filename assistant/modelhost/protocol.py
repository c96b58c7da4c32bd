"""The wire format between a web worker and the model process: JSON lines over a Unix socket.

One connection carries one request. The worker sends one line, ``{"op": "generate", ...}`` or
``{"op": "status"}``; the model process answers with a ``hello`` line (its status) and, for a
generation, one line per event until ``end``:

- ``{"q": 2}``: the request waits for the model, second in line;
- ``{"w": 1}``: how many other requests the model process holds now (it answers one at a time,
  so a positive count means somebody waits);
- ``{"t": " word", "f": null}``: a piece of the answer, ``f`` the finish reason on the last;
- ``{"e": {"code": ..., "message": ..., "started": false}}``: the engine failed;
- ``{"end": true}``: the answer is complete.

The worker cancels by closing the connection. A connection that ends without ``end`` or ``e``
means the model process died: the worker reports ``engine_crashed``. Pure: no I/O, no Django.
"""

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from assistant.engines.base import ChatMessage, Delta, GenerationParams

#: Longest line either side accepts (a request carries the conversation's history).
MAX_LINE_BYTES = 16 * 1024 * 1024
#: Longest path the kernel takes for a Unix socket (sun_path is 108 bytes, NUL included).
MAX_SOCKET_PATH = 107

State = Literal["starting", "up", "down"]


class ProtocolError(ValueError):
    """A line that is not what the protocol allows."""


@dataclass(frozen=True, slots=True)
class HostStatus:
    """What the model process says about itself in every ``hello``."""

    #: ``up``: answering; ``down``: between a crash and the restart (``code`` says why).
    state: State
    pid: int = 0
    #: Times the supervisor started the model process again after it ended.
    restarts: int = 0
    #: When the running model process started (Unix time), if one runs.
    since: float | None = None
    #: How the previous model process ended: a signal name (``SIGSEGV``) or ``exit 3``.
    last_exit: str | None = None
    last_exit_at: float | None = None
    #: Requests the model process holds now (one decoding, the rest waiting).
    active: int = 0
    engine: str = ""
    #: While ``down``: the stable reason a request gets (``engine_restarting``, ``no_model``).
    code: str | None = None
    message: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """Other requests the model process holds now (``{"w": n}``)."""

    others: int


@dataclass(frozen=True, slots=True)
class Failure:
    code: str
    message: str
    #: The engine had produced part of the answer before it failed.
    started: bool = False


@dataclass(frozen=True, slots=True)
class End:
    pass


@dataclass(frozen=True, slots=True)
class Request:
    op: Literal["generate", "status"]
    messages: tuple[ChatMessage, ...] = ()
    params: GenerationParams = field(default_factory=GenerationParams)


Reply = HostStatus | Delta | Waiting | Failure | End


def _line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _load(line: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(line)
    except ValueError:
        raise ProtocolError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(payload, dict):
        raise ProtocolError(f"not an object: {line[:80]!r}")
    return payload


def generate_request(messages: Sequence[ChatMessage], params: GenerationParams) -> bytes:
    return _line(
        {
            "op": "generate",
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "params": asdict(params),
        }
    )


STATUS_REQUEST = _line({"op": "status"})
END = _line({"end": True})


def request_parse(line: bytes) -> Request:
    payload = _load(line)
    op = payload.get("op")
    if op == "status":
        return Request(op="status")
    if op != "generate":
        raise ProtocolError(f"unknown op {op!r}")
    try:
        messages = tuple(
            ChatMessage(role=m["role"], content=str(m["content"])) for m in payload["messages"]
        )
        params = GenerationParams(**payload.get("params", {}))
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"bad generate request: {exc}") from None
    if any(m.role not in ("system", "user", "assistant") for m in messages):
        raise ProtocolError("bad role")
    return Request(op="generate", messages=messages, params=params)


def hello_line(status: HostStatus) -> bytes:
    return _line({"hello": asdict(status)})


def delta_line(delta: Delta) -> bytes:
    if delta.queue_position is not None:
        return _line({"q": delta.queue_position})
    return _line({"t": delta.text, "f": delta.finish_reason})


def waiting_line(others: int) -> bytes:
    return _line({"w": others})


def failure_line(failure: Failure) -> bytes:
    return _line({"e": asdict(failure)})


def reply_parse(line: bytes) -> Reply:
    """One line from the model process, as the worker reads it."""
    payload = _load(line)
    try:
        if "t" in payload:
            return Delta(str(payload["t"]), finish_reason=payload.get("f"))
        if "q" in payload:
            return Delta("", queue_position=int(payload["q"]))
        if "w" in payload:
            return Waiting(int(payload["w"]))
        if "e" in payload:
            return Failure(**payload["e"])
        if "end" in payload:
            return End()
        if "hello" in payload:
            return HostStatus(**payload["hello"])
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"bad reply {line[:80]!r}: {exc}") from None
    raise ProtocolError(f"unknown reply {line[:80]!r}")


def default_socket_path() -> Path:
    """``CHATSITE_MODEL_SOCKET``, else ``var/run/model.sock`` in the checkout, else (a checkout
    too deep for a socket path) a directory of this user's in the temporary directory."""
    configured = os.environ.get("CHATSITE_MODEL_SOCKET")
    if configured:
        return Path(configured)
    local = Path(__file__).resolve().parents[2] / "var" / "run" / "model.sock"
    if len(str(local)) <= MAX_SOCKET_PATH:
        return local
    return Path(tempfile.gettempdir()) / f"chatsite-{os.getuid()}" / "model.sock"
