"""benchmarks/capacity.py ``--through nginx``: each server behind a real nginx (chatsite in its
loopback stack with PostgreSQL and Redis, the peer behind an nginx of its own), one small level
each. The capacities themselves are measured by the benchmark, not here."""

import argparse
from pathlib import Path

import pytest

from benchmarks.capacity import measure_box
from benchmarks.capacity_nginx import box_start

# Short answers close together: enough CPU in a second that the box's clock ticks (10 ms).
#: Each student asks one follow-up in the conversation their question began (chatsite's stack
#: reads its history; the peer names no conversation, so its students ask new questions).
ARGS = argparse.Namespace(
    ttft_ms=5,
    tokens=20,
    itl_ms=2,
    most=10,
    workers=1,
    warmup_s=0.2,
    measure_s=1.0,
    profile=None,
    profiler="py-spy",
    follow_ups=1,
    chatsite_env=[("CHATSITE_LOG_LEVEL", "INFO")],
)


def access_lines(folder: Path) -> list[str]:
    return [
        line
        for log in folder.rglob("access.log")
        for line in log.read_text().splitlines()
        if "POST /api/chat/stream" in line
    ]


@pytest.mark.parametrize("name", ["uvicorn", "chatsite"])
def test_a_level_through_nginx_reads_whole_answers(tmp_path: Path, name: str) -> None:
    with box_start(name, ARGS, tmp_path) as box:
        level = measure_box(box, ARGS, 5)
        if name == "chatsite":
            # A session each: five page loads, five session cookies.
            sessions = {r.split(b"sessionid=")[1].split(b";")[0] for r in box.requests}
            assert len(box.requests) == len(sessions) == 5
        else:
            assert len(box.requests) == 1  # the peer keeps no sessions: one request for all
        lines = access_lines(tmp_path)  # the stack's folder is gone once it is down
    assert level.answers > 0 and level.errors == 0, level
    assert level.tokens_per_s > 0 and level.added_itl_p99 is not None
    assert level.server_cpu > 0
    # The answers went through nginx, from the class's loopback address.
    assert len(lines) >= level.answers
    assert all(line.startswith("127.0.1.1 ") for line in lines), lines[:3]
