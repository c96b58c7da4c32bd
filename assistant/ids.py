"""Random ids for the event loop: version 4 UUIDs cut from a buffer of the kernel's random bytes.

``uuid.uuid4()`` asks the kernel for 16 bytes each time (``os.urandom``), and CPython lets go of
the interpreter lock around that call. On a worker whose database and cache threads are waiting
for the lock, each id then hands it to one of them, and the event loop, with every stream on
it, waits to get it back. An answer takes four ids before its first token (its request id, the
conversation's and its two messages'). Here one call to the kernel fills 4 KiB, 256 ids; the
bytes are the same kernel's, so the ids are as unpredictable as ``uuid.uuid4()``'s.

Each thread cuts ids from a buffer of its own, and a forked child drops what it inherited (else
parent and child would hand out the same ids).
"""

import os
import threading
import uuid

#: Bytes asked of the kernel at once: 256 ids.
CHUNK = 4096
_ID_BYTES = 16
#: The version (4) and variant (RFC 4122) bits, set as ``uuid.UUID(..., version=4)`` sets them.
_KEEP = ~((0xC000 << 48) | (0xF000 << 64)) & ((1 << 128) - 1)
_MARK = (0x8000 << 48) | (4 << 76)


class _Buffer(threading.local):
    def __init__(self) -> None:
        self.data = b""
        self.at = 0


_buffer = _Buffer()


def _forget_inherited() -> None:
    global _buffer
    _buffer = _Buffer()


os.register_at_fork(after_in_child=_forget_inherited)


def random_uuid() -> uuid.UUID:
    """A random (version 4) UUID, as ``uuid.uuid4()`` makes one."""
    buffer = _buffer
    data, at = buffer.data, buffer.at
    if at >= len(data):
        buffer.data = data = os.urandom(CHUNK)
        at = 0
    buffer.at = at + _ID_BYTES
    return uuid.UUID(int=(int.from_bytes(data[at : at + _ID_BYTES]) & _KEEP) | _MARK)
