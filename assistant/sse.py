"""Server-Sent Events wire format: one pure encoder, no Django, no I/O.

Follows the WHATWG HTML "server-sent events" grammar. Every frame ends with a blank line, so a
frame is complete the moment it is written; nothing here buffers. Data containing CR, LF or CRLF
is split into several ``data:`` lines, which a conforming parser joins back with LF.
"""

import json
import re
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _field(name: str, value: str) -> str:
    if _LINE_BREAK.search(value):
        raise ValueError(f"SSE field {name!r} cannot contain a line break")
    return f"{name}: {value}\n"


def _head(event: str | None, id: str | None, retry_ms: int | None) -> str:
    """The fields before the data: optional ``id``/``event``/``retry``."""
    head = ""
    if id is not None:
        if "\0" in id:
            raise ValueError("SSE id cannot contain NUL")
        head = _field("id", id)
    if event is not None:
        head += _field("event", event)
    if retry_ms is not None:
        if retry_ms < 0:
            raise ValueError("SSE retry must be a non-negative integer")
        head += f"retry: {int(retry_ms)}\n"
    return head


def encode_event(
    data: str,
    *,
    event: str | None = None,
    id: str | None = None,
    retry_ms: int | None = None,
) -> bytes:
    """One complete event frame: optional ``id``/``event``/``retry``, then the data lines."""
    lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"{_head(event, id, retry_ms)}{lines}\n".encode()


#: Compact JSON, made once: ``json.dumps`` with options builds a new encoder on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
#: ``_JSON.encode``'s C encoder, made once too (``encode`` makes one for every call): a
#: payload is a fresh tree of dicts, lists and scalars, never circular.
_C_JSON = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _JSON.default, encode_basestring, None, ":", ",", False, False, True)
)


def _json(payload: Any) -> str:
    """``_JSON.encode(payload)``."""
    if _C_JSON is None or isinstance(payload, str):
        return _JSON.encode(payload)
    return "".join(_C_JSON(payload, 0))


def encode_json_event(payload: Any, *, event: str | None = None, id: str | None = None) -> bytes:
    """An event whose data is compact JSON (one line: JSON escapes every line break); without
    ``event``, a plain message (what OpenAI-style streams send)."""
    return f"{_head(event, id, None)}data: {_json(payload)}\n\n".encode()


def encode_token_event(text: str, token_id: int) -> bytes:
    """``encode_json_event({"text": text}, event="token", id=str(token_id))``, byte for byte, as
    one format string: the frame every token of an answer is sent in (an integer id has no
    line break or NUL to check). The text goes straight to the C encoder ``_JSON.encode`` calls
    for a string, without the call through it: once for every token."""
    return f'id: {token_id}\nevent: token\ndata: {{"text":{encode_basestring(text)}}}\n\n'.encode()


def encode_comment(text: str = "") -> bytes:
    """A comment frame (``: text``): ignored by parsers, keeps proxies and watchdogs awake."""
    lines = _LINE_BREAK.split(text)
    return ("".join(f": {line}\n" if line else ":\n" for line in lines) + "\n").encode("utf-8")
