"""The garbage collector as a worker leaves it (assistant/collector.py)."""

import gc
import os
import subprocess
import sys
from pathlib import Path

from assistant.collector import collector_settle

ROOT = Path(__file__).resolve().parents[2]
#: What a worker's collector looks like once chatsite.asgi (the application) is loaded.
SHOW = "import gc, chatsite.asgi; print(gc.get_threshold()[0], gc.get_freeze_count())"


def worker_collector(threshold: str) -> tuple[int, int]:
    """(young threshold, objects frozen) in a fresh process that loaded the application."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "CHATSITE_ENGINE": "scripted",
        "CHATSITE_GC_THRESHOLD": threshold,
    }
    shown = subprocess.run(
        [sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    young, frozen = shown.stdout.split()
    return int(young), int(frozen)


def test_a_worker_freezes_what_it_loaded_and_collects_less_often() -> None:
    young, frozen = worker_collector("10000")
    assert young == 10000
    assert frozen > 10_000  # Django, Channels and chatsite: tens of thousands of objects

    young, unsettled = worker_collector("0")  # Python's own collector
    assert young == 700
    assert unsettled < 1000  # what a library froze for itself, if anything


def test_settle_moves_live_objects_out_of_reach_and_sets_only_the_young_threshold() -> None:
    before = gc.get_threshold()
    kept = [[index] for index in range(1000)]  # live container objects, tracked by the collector
    try:
        collector_settle(5000)
        assert gc.get_threshold() == (5000, *before[1:])
        assert gc.get_freeze_count() >= len(kept)
        reachable = {id(item) for item in gc.get_objects()}
        assert not any(id(item) in reachable for item in kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert gc.get_freeze_count() == 0

    collector_settle(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
