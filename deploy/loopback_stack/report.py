"""How the loopback run tells what happens: progress on stderr, ``StackError`` when it fails.

Every step either succeeds or raises ``StackError`` naming the first thing that is wrong (with
the tail of the log that shows why), so the command line can print one line and exit 1, and a
test can match the message.
"""

import sys
import time
from collections.abc import Callable
from pathlib import Path


class StackError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"[loopback] {message}", file=sys.stderr, flush=True)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StackError(message)


def eventually[T](probe: Callable[[], T], timeout: float = 10) -> T:
    """``probe()`` once it stops raising StackError; its last error after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except StackError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def tail(path: Path, lines: int = 30) -> str:
    """The end of a log, to show with the error that it explains."""
    if not path.exists():
        return f"({path.name}: nothing written)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
