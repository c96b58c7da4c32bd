"""The check for a client that stopped reading asks the kernel only when the client could be
over the limit, and finds it at the same frame as asking at every frame would.

On a real loopback TCP connection whose client never reads, with a real (unconnected) Twisted
transport holding what the kernel would not take.
"""

import socket
from functools import partial
from typing import Any

import pytest
from twisted.internet.abstract import FileDescriptor

from assistant import internals
from assistant.transport import ClientConnection, UnreadWatch
from tests.support import StubReactor

FRAME = b"x" * 4096


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every reading of the kernel's send queue, in order."""
    readings: list[int] = []
    real = internals.kernel_unsent

    def counted(fd: int) -> int | None:
        queued = real(fd)
        readings.append(queued or 0)
        return queued

    monkeypatch.setattr(internals, "kernel_unsent", counted)
    return readings


def _connection(transport: FileDescriptor, sender: socket.socket) -> ClientConnection:
    """The connection as found under Daphne: Twisted's buffer, then the socket's queue."""
    return ClientConnection(
        partial(internals.buffered_bytes, transport), transport.loseConnection, sender.fileno()
    )


def _send(sender: socket.socket, transport: FileDescriptor, frame: bytes) -> None:
    """Write ``frame`` as Daphne would: to the socket, the rest kept by the transport."""
    try:
        written = sender.send(frame) if not transport.dataBuffer else 0
    except BlockingIOError:
        written = 0
    transport.dataBuffer += frame[written:]


def test_a_client_that_keeps_up_is_asked_about_once_per_half_limit(
    tcp_pair: Any, asked: list[int]
) -> None:
    sender, client = tcp_pair
    watch = UnreadWatch(_connection(FileDescriptor(reactor=StubReactor()), sender), 64 * 1024)

    assert watch.over() is None  # the first check asks: nothing is known yet
    assert asked == [0]
    for _ in range(40):  # 160 KiB, each frame read by the client at once
        sender.sendall(FRAME)
        watch.produced(len(FRAME))
        assert watch.over() is None
        client.recv(len(FRAME), socket.MSG_WAITALL)
    # Asked again only once more than 32 KiB (half the limit) could be unread: every 9th frame,
    # or every 8th when the last frame was still unacknowledged at the reading.
    assert 1 + 40 // 9 <= len(asked) <= 1 + 40 // 8


def test_a_client_that_stops_reading_is_found_at_the_same_frame(
    tcp_pair: Any, asked: list[int]
) -> None:
    sender, _client = tcp_pair  # the client never reads
    sender.setblocking(False)
    limit = 256 * 1024
    transport = FileDescriptor(reactor=StubReactor())
    connection = _connection(transport, sender)
    watch = UnreadWatch(connection, limit)

    found, questions = None, 0
    for frame_number in range(1, 10_000):
        _send(sender, transport, FRAME)
        watch.produced(len(FRAME))
        before = len(asked)
        over = watch.over()
        if len(asked) == before:
            # It did not ask, so the client cannot be over the limit: asking now agrees.
            assert over is None
            assert connection.unsent() <= limit
        else:
            questions += 1
        if over is not None:
            found = frame_number
            break
    assert found is not None
    assert over is not None and limit < over <= limit + len(FRAME)
    # Far fewer questions than frames: none while the client could not be over half the limit.
    assert questions < found / 2
