"""The staff dashboard in headless Chromium against a real Daphne serving the scripted engine.

A staff user logs in through the admin's login page, as a teacher would, and keeps the dashboard
open while chats are made on the same server: by ``ChatClient`` (no browser timings) and by the
chat page in a second browser context (which reports its own).
"""

import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from assistant import errors
from assistant.models import StreamRecord
from tests.frontend.axe import axe_violations, format_violations
from tests.frontend.test_chat_page import ask, wait_finished
from tests.support import ChatClient, LiveServer, ModelHost, from_db

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "dashboard-test-password"
# Per path, the sums of each histogram's datasets: (browser-measured, server-measured).
HISTOGRAM_SUMS = """() => Object.fromEntries(
    [...document.querySelectorAll('#histograms canvas')].map((canvas) => [
        canvas.id.replace('histogram-', ''),
        Chart.getChart(canvas).data.datasets.map((d) => d.data.reduce((a, b) => a + b, 0)),
    ]))"""

# Recorded from before any of the page's own scripts run.
CSP_VIOLATIONS = """window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
    window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}`);
});"""


def staff_create(username: str) -> None:
    """A staff account (created with ``from_db``: Playwright's sync API is running)."""
    from django.contrib.auth import get_user_model

    from_db(
        lambda: get_user_model().objects.create_user(
            username=username, password=PASSWORD, is_staff=True
        )
    )


@pytest.fixture
def staff_username() -> str:
    username = f"teacher-{uuid.uuid4().hex[:8]}"
    staff_create(username)
    return username


@pytest.fixture
def dashboard(browser: Browser, daphne: LiveServer, staff_username: str) -> Iterator[Page]:
    """The dashboard on the scripted engine's server."""
    yield from dashboard_open(browser, daphne, staff_username)


def dashboard_open(
    browser: Browser, server: LiveServer, staff_username: str, **context_args: Any
) -> Iterator[Page]:
    """The dashboard, logged in as staff through /admin/login/, with its first snapshot drawn
    (keyword arguments go to ``new_context``, such as ``locale``).

    Uncaught exceptions in the page, and anything its Content-Security-Policy blocks, fail the
    test.
    """
    context_args.setdefault("viewport", {"width": 1400, "height": 1000})
    context = browser.new_context(base_url=server.url, **context_args)
    context.add_init_script(CSP_VIOLATIONS)
    page = context.new_page()
    errors: list[Exception] = []
    page.on("pageerror", lambda error: errors.append(error))
    page.goto("/admin/login/?next=/dashboard/")
    page.locator("#id_username").fill(staff_username)
    page.locator("#id_password").fill(PASSWORD)
    page.locator("#login-form [type=submit]").click()
    page.wait_for_url("**/dashboard/")
    page.wait_for_selector("body[data-ready='1']", state="attached")
    yield page
    blocked = page.evaluate("() => window.__cspViolations")
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"
    assert blocked == [], f"blocked by the Content-Security-Policy: {blocked}"


def requests_shown(page: Page) -> int:
    return int(page.evaluate("() => document.body.dataset.requests"))


def histogram_sums(page: Page) -> tuple[int, int]:
    """(browser-measured, server-measured) requests over every path's histogram."""
    sums = page.evaluate(HISTOGRAM_SUMS).values()
    return sum(s[0] for s in sums), sum(s[1] for s in sums)


def path_of_next_chat(client: ChatClient) -> str:
    events = client.ask("[scripted tokens=2] Which path answers?")
    return next(e for e in events if e.event == "meta").json()["path"]


def wait_for_path(client: ChatClient, expected: str, timeout: float = 6.0) -> None:
    """New chats reach ``expected`` once the server has re-read the split (about a second), and
    keep going there."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(path_of_next_chat(client))
        if seen[-1] == expected:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"new chats never went to {expected!r}: {seen}")
    assert [path_of_next_chat(client) for _ in range(3)] == [expected] * 3


def apply_split(page: Page, *, mode: str, percent: str | None = None) -> None:
    if percent is not None:
        page.locator("#split-percent").fill(percent)
    page.locator("#split-mode").select_option(mode)
    page.locator("#split-save").click()
    expect(page.locator("#split-status")).to_have_text(re.compile(r"^Saved at "))
    expect(page.locator("#split-status")).to_have_class("ok")


def test_new_chats_show_up_live_without_a_reload(
    dashboard: Page,
    chat_client: ChatClient,
    open_chat: Callable[..., Page],
    output_dir: Path,
) -> None:
    """Chats made elsewhere appear within seconds: counts, both histograms, the slowest list."""
    page = dashboard
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.evaluate("() => { window.__sameDocument = true; }")
    page.evaluate(
        "() => { window.__chart = Chart.getChart(document.getElementById('histogram-direct')); }"
    )
    before = requests_shown(page)
    browser_before, server_before = histogram_sums(page)

    for _ in range(3):
        assert path_of_next_chat(chat_client) in {"direct", "django"}
    chat_page = open_chat()
    answer = ask(chat_page, "[scripted tokens=12 ttft_ms=300 itl_ms=20] Why is the sky blue?")
    wait_finished(answer)
    request_id = answer.get_attribute("data-request-id")

    page.wait_for_function(
        "(n) => Number(document.body.dataset.requests) >= n", arg=before + 4, timeout=10_000
    )
    # The browser's own timings arrive with its report, just after the answer ends.
    page.wait_for_function(
        f"(n) => Object.values(({HISTOGRAM_SUMS})()).reduce((a, s) => a + s[0], 0) >= n",
        arg=browser_before + 1,
        timeout=10_000,
    )
    after = requests_shown(page)
    browser_after, server_after = histogram_sums(page)
    assert after == before + 4
    assert server_after == server_before + 4
    assert browser_after == browser_before + 1

    # What is on screen adds up to the same count.
    shown = [
        int(page.locator(f"#path-{path} [data-stat=requests]").inner_text())
        for path in ("direct", "django")
    ]
    assert sum(shown) == after
    expect(page.locator("#path-direct [data-stat=server_p95]")).to_have_text(re.compile(r"ms$"))

    # The slowest chat (300 ms to the first token) leads the waterfall, with both tracks drawn.
    slowest = page.locator("#slowest .slow").first
    expect(slowest).to_have_attribute("data-request-id", request_id)
    expect(slowest.locator("[data-track=server] .seg")).to_have_count(5)
    expect(slowest.locator("[data-track=client] .seg")).to_have_count(3)
    first_token = slowest.locator("[data-track=server] .seg[data-stage=engine_first_token]")
    assert first_token.evaluate("(el) => el.getBoundingClientRect().width") > 10

    # Drawn in place: same document, same chart objects, no navigation.
    assert page.evaluate("() => window.__sameDocument") is True
    assert page.evaluate(
        "() => Chart.getChart(document.getElementById('histogram-direct')) === window.__chart"
    )
    assert navigations == []

    # Another window reopens the stream for that window; the same chats are in the last day.
    with page.expect_request(re.compile(r"/dashboard/events\?window=24h$")):
        page.locator("#window-24h").click()
    expect(page.locator("#window-24h")).to_have_attribute("aria-pressed", "true")
    expect(page.locator("#window-5m")).to_have_attribute("aria-pressed", "false")
    page.wait_for_function("() => document.body.dataset.window === '24h'")
    expect(page.locator("#generated-at")).to_contain_text("24 hours")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    assert requests_shown(page) == after
    page.screenshot(path=output_dir / "dashboard.png", full_page=True)


def test_the_split_form_decides_where_new_chats_go(
    dashboard: Page, chat_client: ChatClient, staff_username: str
) -> None:
    """Forcing a path through the form sends new chats there, and the change is logged."""
    page = dashboard
    try:
        apply_split(page, mode="force_baseline")
        wait_for_path(chat_client, "direct")
        expect(page.locator("#split-current")).to_have_attribute("data-mode", "force_baseline")

        apply_split(page, mode="force_candidate", percent="25")
        wait_for_path(chat_client, "django")
        current = page.locator("#split-current")
        expect(current).to_have_attribute("data-mode", "force_candidate")
        expect(current).to_contain_text("Every new chat goes to the candidate (django)")
        expect(current).to_contain_text(staff_username)
        logged = page.locator("#breaker-events li[data-kind=split_changed]")
        expect(logged.first).to_contain_text(staff_username)
        # The chats it sent are counted on the candidate's path.
        page.wait_for_function(
            "() => Number(document.querySelector('#path-django [data-stat=requests]')"
            ".textContent) >= 4",
            timeout=10_000,
        )
        # Snapshots arriving since did not undo what the form shows.
        expect(page.locator("#split-mode")).to_have_value("force_candidate")
        expect(page.locator("#split-percent")).to_have_value("25")
    finally:
        apply_split(page, mode="auto", percent="0")


def test_a_refused_change_shows_the_servers_reason(dashboard: Page) -> None:
    """A change the server refuses (the session ended) says why and keeps what was typed."""
    page = dashboard
    page.context.clear_cookies(name="sessionid")
    page.locator("#split-percent").fill("37.5")
    page.locator("#split-mode").select_option("force_candidate")
    page.locator("#split-save").click()

    status = page.locator("#split-status")
    expect(status).to_have_text(str(errors.LOGIN_REQUIRED.message))
    expect(status).to_have_class("error")
    page.wait_for_timeout(1500)  # a snapshot or two
    expect(page.locator("#split-percent")).to_have_value("37.5")
    expect(page.locator("#split-mode")).to_have_value("force_candidate")
    expect(page.locator("#split-current")).to_have_attribute("data-mode", "auto")


def test_the_model_process_card_shows_its_restarts(
    browser: Browser, daphne_factory, staff_username: str, tmp_path: Path
) -> None:
    """With the embedded engine's process (hosting the scripted engine, for speed), the card
    says it answers; after a SIGKILL it counts the restart and says how the last one ended."""
    host = ModelHost(
        tmp_path / "modelhost.log", backend="assistant.engines.scripted.ScriptedEngine"
    )
    server = daphne_factory(CHATSITE_ENGINE="llamacpp", CHATSITE_MODEL_SOCKET=str(host.socket))
    try:
        for page in dashboard_open(browser, server, staff_username):
            card, rows = page.locator("#engines-card"), page.locator("#engines")
            expect(card).to_be_visible()
            expect(rows).to_contain_text("answering")
            expect(rows).to_have_attribute("data-restarts", "0")
            host.kill_runner(signal.SIGKILL)
            host.wait_until(lambda status: status.state == "up" and status.restarts == 1)
            expect(rows).to_have_attribute("data-restarts", "1", timeout=10_000)
            expect(rows).to_contain_text("SIGKILL")
            expect(rows).to_contain_text("answering")
    finally:
        server.stop()
        host.stop()


def test_a_chinese_browser_gets_the_dashboard_in_chinese(
    browser: Browser,
    daphne: LiveServer,
    staff_username: str,
    chat_client: ChatClient,
    output_dir: Path,
) -> None:
    """zh-CN: the login page, the headings and what the scripts write (live status, badge,
    cards, waterfall, split form, breaker log) are in Chinese; the hooks the scripts and tests
    use are not; no serious accessibility violation."""
    for _ in range(2):
        assert path_of_next_chat(chat_client) in {"direct", "django"}
    for page in dashboard_open(browser, daphne, staff_username, locale="zh-CN"):
        expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")
        expect(page.locator("h1")).to_have_text("流式仪表盘")
        expect(page.locator("#breaker-title")).to_have_text("熔断器")
        expect(page.locator("#window-5m")).to_have_text("5 分钟")
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
        expect(page.locator("#live")).to_have_text("● 实时")
        expect(page.locator("#generated-at")).to_contain_text("最近 5 分钟 · ")
        ratio = page.locator("#ratio")
        expect(ratio.locator(".ratio-title")).to_have_text("django 对比 direct：")
        expect(ratio).to_contain_text("服务器 P95")
        expect(page.locator("#path-direct .role")).to_have_text("基线")
        expect(page.locator("#path-direct")).to_contain_text("请求数")
        expect(page.locator("#path-direct tbody tr[data-side=client] th")).to_have_text("浏览器")
        expect(page.locator("#breaker-state")).to_have_attribute("data-state", "closed")
        expect(page.locator("#breaker-state")).to_have_text("闭合")
        expect(page.locator("#split-current")).to_contain_text("的新对话交给 django。")
        # The answers above came from this Daphne worker, which names its server.
        expect(page.locator("#servers-title")).to_have_text("HTTP 服务器")
        expect(page.locator("#servers")).to_contain_text("服务器首字时间 P50 / P95")
        expect(page.locator("#servers-compared")).to_have_text(
            "此时间窗口内只有一种服务器在应答：无从比较。"
        )
        slowest = page.locator("#slowest .slow").first
        expect(slowest.locator(".track-row").first).to_contain_text("首字")
        expect(slowest.locator(".outcome")).to_have_text("正常")
        expect(slowest.locator(".outcome")).to_have_attribute("data-outcome", "ok")
        assert (
            page.evaluate(
                "() => Chart.getChart(document.getElementById('histogram-direct'))"
                ".options.scales.y.title.text"
            )
            == "请求数"
        )

        # The split form: its answer, and the change it logged, in Chinese.
        page.locator("#split-mode").select_option("auto")
        page.locator("#split-save").click()
        expect(page.locator("#split-status")).to_have_text(re.compile(r"^已于 .+ 保存。$"))
        logged = page.locator("#breaker-events li[data-kind=split_changed]").first
        expect(logged.locator(".kind")).to_have_text("分流已更改")
        expect(logged.locator(".actor")).to_have_text(f"操作人：{staff_username}")

        violations = axe_violations(page)
        assert not violations, format_violations(violations)
        page.screenshot(path=output_dir / "dashboard-zh.png", full_page=True)


def test_the_servers_card_says_which_server_was_faster(dashboard: Page) -> None:
    """Records from workers of both servers: the card lists each server's answers and TTFTs and
    names the one faster for students (the lower browser P95)."""

    def store() -> None:
        now = timezone.now()
        StreamRecord.objects.bulk_create(
            StreamRecord(
                request_id=uuid.uuid4().hex, created_at=now - timedelta(seconds=5),
                owner_key="session:servers", path="direct", engine="scripted", outcome="ok",
                server=server, server_ttft_ms=ms, client_outcome="ok", client_ttft_ms=ms + 5,
                client_reported_at=now,
            )
            for server, values in (("daphne", (40.0, 60.0, 80.0)), ("uvicorn", (20.0, 30.0)))
            for ms in values
        )  # fmt: skip

    from_db(store)
    expect(dashboard.locator("#servers-card")).to_be_visible()
    terms = [
        *("daphne", "Server TTFT P50 / P95", "Browser TTFT P50 / P95"),
        *("uvicorn", "Server TTFT P50 / P95", "Browser TTFT P50 / P95"),
    ]
    expect(dashboard.locator("#servers dt")).to_have_text(terms)
    servers = dashboard.locator("#servers dd")
    expect(servers.nth(0)).to_have_text("3 requests, 0.0 % errors")
    expect(servers.nth(1)).to_have_text("60 ms / 78 ms")
    expect(servers.nth(3)).to_have_text("2 requests, 0.0 % errors")
    expect(servers.nth(5)).to_have_text("30 ms / 35 ms")
    compared = dashboard.locator("#servers-compared")
    expect(compared).to_have_attribute("data-faster", "uvicorn")
    expect(compared).to_have_text(
        re.compile(r"^uvicorn vs daphne: server ×0\.\d\d / ×0\.\d\d, browser .+ "
                   r"Faster for students: uvicorn\.$")
    )  # fmt: skip


def test_a_longer_window_says_its_percentiles_come_from_sums(dashboard: Page) -> None:
    """Streams from half an hour ago are counted in the 1 h window from their minute's sums:
    each card says its percentiles are within a bin of the exact ones; the 5 m window, read
    record by record, says nothing of the kind."""

    def store() -> None:
        at = timezone.now() - timedelta(minutes=30)
        StreamRecord.objects.bulk_create(
            StreamRecord(
                request_id=uuid.uuid4().hex, created_at=at, owner_key="session:earlier",
                path="direct", engine="scripted", outcome="ok", server_ttft_ms=ms,
            )
            for ms in (40.0, 60.0, 80.0)
        )  # fmt: skip

    from_db(store)
    note = dashboard.locator("#path-direct .ttft-note")
    expect(note).to_be_hidden()
    dashboard.locator("#window-1h").click()
    expect(dashboard.locator("#path-direct")).to_have_attribute("data-percentiles", "binned")
    expect(note).to_be_visible()
    expect(note).to_have_text(re.compile(r"^Percentiles from per-minute and per-hour sums"))
    server_p50 = dashboard.locator("#path-direct [data-stat=server_p50]")
    expect(server_p50).to_have_text(re.compile(r"^6[01](\.\d)? ms$"))
    dashboard.locator("#window-5m").click()
    expect(dashboard.locator("#path-direct")).to_have_attribute("data-percentiles", "exact")
    expect(note).to_be_hidden()


def test_a_viewer_no_longer_staff_is_told_and_the_page_stops_asking(
    browser: Browser, daphne_factory: Callable[..., LiveServer], staff_username: str
) -> None:
    """Staff status is checked again every second here (CHATSITE_DASHBOARD_RECHECK_S): once the
    account is demoted, the page says so within a few seconds and stops reconnecting."""
    from django.contrib.auth import get_user_model

    server = daphne_factory(CHATSITE_DASHBOARD_RECHECK_S="1")
    for page in dashboard_open(browser, server, staff_username):
        from_db(
            lambda: get_user_model().objects.filter(username=staff_username).update(is_staff=False)
        )
        live = page.locator("#live")
        expect(live).to_have_attribute("data-state", "forbidden", timeout=10_000)
        expect(live).to_have_text("staff access ended: log in again to see the figures")
        # No reconnection after it: the state stays, nothing is refused in a loop.
        page.wait_for_timeout(3000)
        expect(live).to_have_attribute("data-state", "forbidden")
