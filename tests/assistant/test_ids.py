"""Ids (``assistant.ids``): version 7 UUIDs, the time in milliseconds then random bits, in the
order they are made, with one call to the kernel per 256 of them, none handed out twice: not
across threads, not after a fork."""

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from assistant import ids

ROOT = Path(__file__).resolve().parents[2]


def millis(made: uuid.UUID) -> int:
    return made.int >> 80


def test_each_id_is_a_version_7_uuid_of_the_millisecond_it_was_made_in() -> None:
    before = time.time_ns() // 1_000_000
    made = [ids.ordered_uuid() for _ in range(3 * ids.CHUNK // 16 + 5)]  # across refills
    after = time.time_ns() // 1_000_000

    assert {u.version for u in made} == {7}
    assert {u.variant for u in made} == {uuid.RFC_4122}
    assert len(set(made)) == len(made)
    assert all(before <= millis(u) <= after for u in made)
    # Every bit below the time's but the version's and the variant's varies (each of them set
    # in some id), and none of the version's and variant's is random.
    varying = 0
    for u in made:
        varying |= u.int & ((1 << 80) - 1)
    assert varying == ids._KEEP | ids._MARK


def test_ids_of_later_milliseconds_sort_after_earlier_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By their value, as text and as hex alike, whatever their random bits."""
    clock = iter(ms * 1_000_000 + 999_999 for ms in range(1_700_000_000_000, 1_700_000_000_300))
    monkeypatch.setattr(ids, "time_ns", lambda: next(clock))
    made = [ids.ordered_uuid() for _ in range(300)]

    assert [millis(u) for u in made] == list(range(1_700_000_000_000, 1_700_000_000_300))
    assert sorted(made) == made
    assert sorted(str(u) for u in made) == [str(u) for u in made]
    assert sorted(u.hex for u in made) == [u.hex for u in made]


def test_the_kernel_is_asked_once_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.urandom`` lets go of the interpreter lock: it is called once per 256 ids, not per id."""
    asked: list[int] = []
    urandom = os.urandom

    def counted(size: int) -> bytes:
        asked.append(size)
        return urandom(size)

    monkeypatch.setattr(ids, "_buffer", ids._Buffer())  # empty: the first id asks
    monkeypatch.setattr(os, "urandom", counted)
    for _ in range(600):
        ids.ordered_uuid()

    assert asked == [ids.CHUNK] * 3  # 256 + 256 + 88 ids


def test_threads_cut_ids_from_buffers_of_their_own() -> None:
    made: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def take(into: list[uuid.UUID]) -> None:
        into.extend(ids.ordered_uuid() for _ in range(500))

    threads = [threading.Thread(target=take, args=(into,)) for into in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [u for into in made for u in into]
    assert len(set(every)) == len(every) == 2000


#: In a process of its own (this one has threads: forking it is not safe): the parent's next id
#: and its forked child's first, which the parent reads from a pipe.
FORKED = """
import os, uuid
from assistant import ids
ids.ordered_uuid()  # the buffer now holds ids the parent has not handed out yet
read, write = os.pipe()
child = os.fork()
if child == 0:
    os.write(write, ids.ordered_uuid().bytes)
    os._exit(0)
os.close(write)
from_child = os.read(read, 16)
os.waitpid(child, 0)
print(uuid.UUID(bytes=from_child), ids.ordered_uuid())
"""


def test_a_forked_child_does_not_hand_out_its_parents_next_ids() -> None:
    run = subprocess.run(
        [sys.executable, "-c", FORKED], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert run.returncode == 0, run.stderr
    from_child, from_parent = (uuid.UUID(text) for text in run.stdout.split())
    assert from_child.version == from_parent.version == 7
    # Their random bits differ (their milliseconds may not).
    assert from_child.int & ids._KEEP != from_parent.int & ids._KEEP
