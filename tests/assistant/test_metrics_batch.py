"""``metrics.observe_all``: an answer's gaps between tokens observed as one update give the
exposition that observing them one by one gives, in one process and in multiprocess mode; and
``metrics.child``, the labelled children an answer's metrics are looked up in once."""

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest
from prometheus_client import CollectorRegistry, Histogram

from assistant import metrics
from assistant.models import StreamRecord
from assistant.services.telemetry import AnswerSummary, stream_observe
from assistant.services.timings import StreamTimings
from tests.support import ROOT

#: Below the first bound, on bounds exactly (``observe`` counts a bound as reached), between
#: them, above the last finite one (+Inf), zero and a negative amount.
AMOUNTS = [0.0005, 0.001, 0.0011, 0.01, 0.01, 0.034, 0.05, 0.3, 5, 7.5, 0, -0.002]


def exposition(histogram: Histogram) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in histogram.collect()
        for s in family.samples
        if s.labels.get("path") == "p"
    }


def histogram() -> Histogram:
    return Histogram(
        "gaps_seconds",
        "test",
        ["path"],
        buckets=metrics.GAP_BUCKETS,
        registry=CollectorRegistry(),
    )


def test_one_update_exposes_what_observing_each_does() -> None:
    one_by_one, at_once = histogram(), histogram()
    for amount in AMOUNTS:
        one_by_one.labels("p").observe(amount)
    metrics.observe_all(at_once.labels("p"), AMOUNTS)
    expected, got = exposition(one_by_one), exposition(at_once)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    assert got[("gaps_seconds_count", "")] == len(AMOUNTS)
    assert got[("gaps_seconds_bucket", "0.001")] == 4  # 0.0005, 0.001, 0, -0.002
    assert got[("gaps_seconds_bucket", "+Inf")] == len(AMOUNTS)


def test_nothing_to_observe_changes_nothing() -> None:
    untouched = histogram()
    untouched.labels("p")
    before = exposition(untouched)
    metrics.observe_all(untouched.labels("p"), [])
    assert exposition(untouched) == before


def test_an_answers_gaps_reach_the_inter_token_histogram() -> None:
    child = metrics.INTER_TOKEN.labels("direct", "gaps-test", "")  # no server named here
    count = samples_count(child)
    timings = StreamTimings(received=1.0, first_token_sent=1.1, finished=2.0, tokens=4)
    for at in (1.11, 1.13, 1.33):
        timings.token_sent(at)
    stream_observe(
        AnswerSummary(
            request_id="r",
            owner_key="session:x",
            classroom_id=None,
            serving_path="direct",
            engine="gaps-test",
            outcome=StreamRecord.Outcome.OK,
            error_code="",
            conversation_id=uuid.uuid4(),
            message_id=uuid.uuid4(),
            timings=timings,
        )
    )
    assert samples_count(child) == count + 3


def test_a_child_is_looked_up_once_and_is_the_metrics_own() -> None:
    parent = histogram()
    first = metrics.child(parent, "p")
    assert first is parent.labels("p")  # what labels() gives: observations reach the metric
    calls = []
    parent.labels = lambda *values: calls.append(values)  # type: ignore[method-assign]
    assert metrics.child(parent, "p") is first  # kept: labels() is not asked again
    assert calls == []
    metrics.child(parent, "q")  # other values: looked up
    assert calls == [("q",)]
    first.observe(0.02)
    assert exposition(parent)[("gaps_seconds_count", "")] == 1


def test_the_children_of_two_metrics_are_kept_apart() -> None:
    one, other = histogram(), histogram()
    assert metrics.child(one, "p") is one.labels("p")
    assert metrics.child(other, "p") is other.labels("p")
    assert metrics.child(one, "p") is not metrics.child(other, "p")


def samples_count(child: Histogram) -> float:
    return next(
        s.value for family in child.collect() for s in family.samples if s.name.endswith("_count")
    )


MULTIPROCESS = textwrap.dedent(
    """
    import json, sys
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.multiprocess import MultiProcessCollector
    from assistant import metrics

    amounts = json.loads(sys.argv[1])
    for name, way in (("one_by_one", "each"), ("at_once", "all")):
        child = Histogram(name, "test", ["path"], buckets=metrics.GAP_BUCKETS).labels("p")
        if way == "each":
            for amount in amounts:
                child.observe(amount)
        else:
            metrics.observe_all(child, amounts)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    print(json.dumps({
        f"{s.name}|{s.labels.get('le', '')}": s.value
        for family in registry.collect() for s in family.samples
    }))
    """
)


def test_one_update_in_multiprocess_mode(tmp_path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", MULTIPROCESS, json.dumps(AMOUNTS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    samples = json.loads(run.stdout)
    each = {k.removeprefix("one_by_one"): v for k, v in samples.items() if "one_by_one" in k}
    once = {k.removeprefix("at_once"): v for k, v in samples.items() if "at_once" in k}
    assert once.keys() == each.keys() and "_count|" in once
    for key, value in each.items():
        assert once[key] == pytest.approx(value), key
    assert once["_count|"] == len(AMOUNTS)
