"""Ids for the event loop: version 7 UUIDs (RFC 9562), in the order they are made, their random
bits cut from a buffer of the kernel's random bytes.

``uuid.uuid4()`` asks the kernel for 16 bytes each time (``os.urandom``), and CPython lets go of
the interpreter lock around that call. On a worker whose database and cache threads are waiting
for the lock, each id then hands it to one of them, and the event loop, with every stream on
it, waits to get it back. An answer takes four ids before its first token (its request id, the
conversation's and its two messages'). Here one call to the kernel fills 4 KiB, 256 ids; the
bytes are the same kernel's, so the ids are as unpredictable as ``uuid.uuid4()``'s in their 74
random bits. Each thread cuts ids from a buffer of its own, and a forked child drops what it
inherited (else parent and child would hand out the same ids).

Why in order: the ids are the keys of the rows an answer stores (its conversation, its messages)
and of the indexes on its request id. An index on random ids takes each new row at a random
place, so each row of the writer's batch dirties a page of its own, and each of those pages is
written again at the commit (SQLite's WAL, PostgreSQL's). Ids in the order they are made go to
the end of the index, a batch's rows together on its last page. 74 random bits are beyond
guessing, as 122 were (and every read of a conversation is checked against its owner anyway);
what an id tells besides is the millisecond it was made in, which its owner is shown.
"""

import os
import threading
import uuid
from time import time_ns

#: Bytes asked of the kernel at once: 256 ids.
CHUNK = 4096
_ID_BYTES = 16
#: The random bits an id keeps: below its 48 bits of milliseconds, but for the version's and
#: the variant's (set as ``uuid.UUID(..., version=7)`` sets them).
_KEEP = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 80) - 1)
_MARK = (0x8000 << 48) | (7 << 76)


class _Buffer(threading.local):
    def __init__(self) -> None:
        self.data = b""
        self.at = 0


_buffer = _Buffer()


def _forget_inherited() -> None:
    global _buffer
    _buffer = _Buffer()


os.register_at_fork(after_in_child=_forget_inherited)


def _random_bits() -> int:
    """128 random bits from this thread's buffer."""
    buffer = _buffer
    data, at = buffer.data, buffer.at
    if at >= len(data):
        buffer.data = data = os.urandom(CHUNK)
        at = 0
    buffer.at = at + _ID_BYTES
    return int.from_bytes(data[at : at + _ID_BYTES])


def ordered_uuid() -> uuid.UUID:
    """A version 7 UUID (RFC 9562): the Unix time in milliseconds, then 74 random bits. Ids made
    in different milliseconds sort (as UUIDs, as text) in the order they were made."""
    millis = time_ns() // 1_000_000
    return uuid.UUID(int=(millis << 80) | (_random_bits() & _KEEP) | _MARK)
