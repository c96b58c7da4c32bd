"""``manage.py ttft_bench`` run for real against Daphne on loopback (scripted engine)."""

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from matplotlib.image import imread

from assistant.models import Conversation, Message
from tests.support import ROOT, LiveServer, ThreadedCountingProxy, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = "[scripted ttft_ms=0 itl_ms=0 tokens=2]"


@pytest.fixture(scope="module")
def server(daphne_factory) -> LiveServer:
    """Daphne whose engine answers 10 tokens, the first after 200 ms, then one every 10 ms."""
    return daphne_factory(
        CHATSITE_SCRIPTED_TTFT_MS="200",
        CHATSITE_SCRIPTED_ITL_MS="10",
        CHATSITE_SCRIPTED_TOKENS="10",
    )


def bench(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("ttft_bench", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_measures_a_200_ms_first_token_like_a_browser(server: LiveServer, tmp_path: Path) -> None:
    """20 questions from 2 students: P50 TTFT just above the engine's 200 ms, every answer whole,
    one session per student, and the JSON and histogram files written."""
    json_file, png_file = tmp_path / "run.json", tmp_path / "ttft.png"
    report, progress = bench(
        *("--url", server.url, "-n", "20", "-c", "2"),
        *("--json", str(json_file), "--histogram", str(png_file)),
    )

    p50 = float(re.search(r"^TTFT\s+([\d.]+)", report, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert 200 <= p50 <= 230, report
    assert re.search(r"^outcomes\s+ok 20$", report, re.MULTILINE), report
    for row in ("headers", "TTFB", "ITL", "TPOT", "E2E"):
        assert re.search(rf"^{row}(\s+[\d.]+){{5}}\s+\d+$", report, re.MULTILINE), report
    assert "server TTFT" in report and "engine TTFT" in report
    assert "20/20" in progress

    document = json.loads(json_file.read_text())
    samples = document["samples"]
    assert len(samples) == 20
    assert all(s["outcome"] == "ok" and s["tokens"] == 10 for s in samples), samples
    assert all(len(s["itl_ms"]) == 9 for s in samples)
    assert all(s["headers_ms"] <= s["ttfb_ms"] <= s["ttft_ms"] <= s["e2e_ms"] for s in samples)
    assert all(s["server_ttft_ms"] is not None for s in samples)
    assert {s["worker"] for s in samples} == {0, 1}
    assert document["summary"]["ttft_ms"]["p50"] == pytest.approx(p50, abs=0.05)
    assert document["summary"]["outcomes"] == {"ok": 20}

    # Each student kept its cookies: 20 answers saved under exactly two sessions.
    request_ids = {s["request_id"] for s in samples}
    answers = Message.objects.filter(request_id__in=request_ids, role=Message.Role.ASSISTANT)
    wait_for(lambda: answers.count() == 20)
    owners = set(
        Conversation.objects.filter(messages__in=answers).values_list("owner_key", flat=True)
    )
    assert len(owners) == 2 and all(owner.startswith("session:") for owner in owners)

    assert png_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(png_file).shape[:2] == (450, 800)


def test_each_serving_path_can_be_measured(server: LiveServer) -> None:
    """--path direct and --path django reach their own endpoint and answer in full."""
    for path in ("direct", "django"):
        report, _ = bench(
            *("--url", server.url, "-n", "3", "--path", path, "--no-progress", "--prompt", FAST)
        )
        assert re.search(r"^outcomes .*ok 3", report, re.MULTILINE), report


def test_a_url_without_chatsite_is_a_clear_error(server: LiveServer) -> None:
    """A URL without chatsite behind it answers 404: the command stops with a CommandError
    naming the URL, and exits non-zero from the shell."""
    elsewhere = f"{server.url}/elsewhere"
    with pytest.raises(CommandError, match=r"GET .*/elsewhere/ answered 404"):
        bench("--url", elsewhere, "-n", "3", "--path", "django", "--no-progress")

    result = subprocess.run(
        [sys.executable, "manage.py", "ttft_bench", "--url", elsewhere, "--path", "django"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "CommandError" in result.stderr and "404" in result.stderr, result.stderr
    assert result.stdout == ""


def test_outcomes_are_counted_by_kind(server: LiveServer, tmp_path: Path) -> None:
    """An answer, an engine failure mid-stream and a hang past --timeout are counted apart."""
    json_file = tmp_path / "run.json"
    report, _ = bench(
        *("--url", server.url, "-n", "3", "-c", "3", "--timeout", "1", "--no-progress"),
        *("--prompt", FAST, "--prompt", "[scripted fail_after=2]", "--prompt", "[scripted hang=1]"),
        *("--json", str(json_file)),
    )
    assert re.search(r"^outcomes .*ok 1", report, re.MULTILINE), report
    assert "error_event: engine_error 1" in report
    assert "timeout 1" in report
    samples = json.loads(json_file.read_text())["samples"]
    assert [(s["outcome"], s["tokens"]) for s in samples] == [
        ("ok", 2),
        ("error_event", 2),
        ("timeout", 0),
    ]


def test_no_successful_request_fails_the_command(server: LiveServer) -> None:
    """When every answer fails, the report is printed and the command still fails."""
    out = io.StringIO()
    with pytest.raises(CommandError, match="No request succeeded"):
        call_command(
            *("ttft_bench", "--url", server.url, "-n", "2", "--no-progress"),
            *("--prompt", "[scripted fail_after=0]"),
            stdout=out,
            stderr=io.StringIO(),
        )
    assert "error_event: engine_unavailable 2" in out.getvalue()


def test_open_loop_sends_on_schedule_whatever_the_answers(
    server: LiveServer, tmp_path: Path
) -> None:
    """--rate 50 with constant arrivals schedules a request every 20 ms and reports it."""
    json_file = tmp_path / "run.json"
    report, _ = bench(
        *("--url", server.url, "-n", "8", "--rate", "50", "--arrival", "constant"),
        *("--prompt", FAST, "--json", str(json_file), "--no-progress"),
    )
    assert "open loop, constant arrivals at 50/s" in report
    samples = json.loads(json_file.read_text())["samples"]
    assert [s["scheduled_s"] for s in samples] == pytest.approx([i * 0.02 for i in range(8)])
    assert all(s["outcome"] == "ok" for s in samples)


@pytest.fixture
def relay(server: LiveServer) -> Iterator[ThreadedCountingProxy]:
    with ThreadedCountingProxy(server.port) as counter:
        yield counter


@pytest.mark.parametrize(("flags", "connections"), [((), 2 + 6), (("--keepalive",), 2)])
def test_each_question_opens_a_new_connection_unless_keepalive(
    relay: ThreadedCountingProxy, flags: tuple[str, ...], connections: int
) -> None:
    """By default every page load and every question opens its own connection, as a browser's
    new chat stream does; with --keepalive each student keeps one."""
    report, _ = bench(
        *("--url", relay.url, "-n", "6", "-c", "2", "--prompt", FAST, "--no-progress", *flags)
    )
    assert re.search(r"^outcomes\s+ok 6$", report, re.MULTILINE), report
    assert relay.accepted == connections
