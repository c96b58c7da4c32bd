"""Several Daphne workers sharing PROMETHEUS_MULTIPROC_DIR: /metrics on any one adds them up."""

import os
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ROOT, ChatClient, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def streams_total(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ai_streams_total" and s.labels.get("outcome") == "ok"
    )


def test_two_workers_report_the_sum_after_a_reset(daphne_factory, tmp_path) -> None:
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    (metrics_dir / "counter_99999.db").write_bytes(b"left over from an earlier run")
    reset = subprocess.run(
        [sys.executable, "manage.py", "metrics_reset"],
        cwd=ROOT,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        capture_output=True,
        text=True,
    )
    assert reset.returncode == 0, reset.stderr
    assert not list(metrics_dir.glob("*.db"))

    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    first, second = daphne_factory(**env), daphne_factory(**env)
    clients = [ChatClient(first), ChatClient(second)]
    try:
        clients[0].ask("[scripted tokens=2 ttft_ms=0]")
        clients[1].ask("[scripted tokens=2 ttft_ms=0]")
        clients[1].ask("[scripted tokens=2 ttft_ms=0]")
    finally:
        for client in clients:
            client.close()
    # Each worker counts its ended answers together every telemetry.ENDS_BATCH_S (0.2 s): a
    # scrape sees the other worker's within that.
    assert wait_for(lambda: streams_total(first.url) == 3)
    assert wait_for(lambda: streams_total(second.url) == 3)
