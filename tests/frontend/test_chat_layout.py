"""The chat page on a phone and on a desktop, in Chinese and in English, in headless Chromium
against a real Daphne: no sideways scrolling, the question box always on screen, the
conversations in a drawer on a phone, the language from the browser, dark mode, the keyboard,
and a refused question asked again by itself after the server's Retry-After.

Screenshots of each go to test-output/ (not committed).
"""

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.frontend.axe import axe_violations, format_violations
from tests.frontend.test_chat_page import ANSWERS, ask, wait_finished
from tests.support import LiveServer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
# An answer with what most often pushes a page sideways on a phone: a long unbroken word, a
# wide code block and a wide table.
WIDE_ANSWER = json.dumps(
    [
        "Wide things: ",
        "x" * 300,
        "\n\n```\nwide = " + "y" * 200 + "\n```\n\n",
        "| a | b | c | d | e | f |\n|---|---|---|---|---|---|\n",
        "| " + " | ".join(["cell-" + "z" * 30] * 6) + " |\n",
    ]
)
OVERFLOW = """() => ({
    page: document.documentElement.scrollWidth - window.innerWidth,
    body: document.body.scrollWidth - document.body.clientWidth,
})"""


def open_in(open_chat: Callable[..., Page], viewport: dict[str, int], locale: str, **kw) -> Page:
    return open_chat(viewport=viewport, locale=locale, **kw)


@pytest.mark.parametrize("locale", ["zh-CN", "en-US"])
@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_page_fits_the_screen_in_both_languages(
    open_chat: Callable[..., Page], output_dir: Path, viewport: dict[str, int], locale: str
) -> None:
    """At 390 × 844 and 1280 × 800, in zh-CN and en-US: the page speaks the browser's language,
    markdown appears before the answer is done, nothing scrolls sideways even with a wide
    answer, the question box stays on screen after a long answer, and axe-core finds no serious
    or critical violation."""
    page = open_in(open_chat, viewport, locale)
    chinese = locale.startswith("zh")
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans" if chinese else "en")
    expect(page.locator("#send")).to_have_text("发送" if chinese else "Send")
    expect(page.locator("#prompt")).to_have_attribute(
        "placeholder", "输入问题，按回车发送" if chinese else "Type your question and press Enter"
    )
    expect(page.locator("#prompt")).to_be_in_viewport()

    # Markdown appears before the answer is done.
    formatted = ask(page, "[scripted itl_ms=30 text='\"**Light** feeds plants, slowly.\"'] 光")
    expect(formatted.locator(".body strong")).to_have_text("Light")
    expect(formatted).to_have_class(re.compile(r"\bstreaming\b"))
    wait_finished(formatted)

    answer = ask(page, f"[scripted ttft_ms=0 itl_ms=0 text='{WIDE_ANSWER}'] 宽")
    wait_finished(answer)
    expect(answer.locator("pre")).to_be_visible()
    expect(answer.locator("table")).to_be_visible()
    long_answer = ask(page, "[scripted tokens=120 ttft_ms=0 itl_ms=1] 长")
    wait_finished(long_answer)
    overflow = page.evaluate(OVERFLOW)
    assert overflow == {"page": 0, "body": 0}, overflow
    expect(page.locator("#prompt")).to_be_in_viewport()
    expect(page.locator("#send")).to_be_in_viewport()
    # The view followed the answer to its end.
    expect(long_answer).to_be_in_viewport()
    if chinese:
        expect(page.locator("#model-language")).to_contain_text("只会用英语回答")
    violations = axe_violations(page)
    assert not violations, format_violations(violations)
    name = f"chat-{locale}-{viewport['width']}x{viewport['height']}.png"
    page.screenshot(path=output_dir / name)


def test_phone_keeps_conversations_in_a_drawer(
    open_chat: Callable[..., Page], output_dir: Path
) -> None:
    """On a phone the conversations are off screen until the menu opens them; choosing one opens
    it and closes the drawer; Esc closes the drawer and gives focus back to the menu button."""
    # Without the slide, so the screenshot shows the drawer where it stops.
    page = open_in(open_chat, PHONE, "zh-CN", reduced_motion="reduce")
    wait_finished(ask(page, "[scripted tokens=3] 第一个问题"))
    entry = page.locator("#conversations li button.open").first
    expect(entry).to_have_text(re.compile("第一个问题"))
    expect(page.locator("#drawer")).not_to_be_in_viewport()
    menu = page.locator("#menu")
    expect(menu).to_have_attribute("aria-expanded", "false")
    menu.click()
    expect(page.locator("#drawer")).to_be_in_viewport()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#new-chat")).to_be_focused()
    page.screenshot(path=output_dir / "chat-zh-CN-drawer.png")
    violations = axe_violations(page)
    assert not violations, format_violations(violations)
    page.keyboard.press("Escape")
    expect(page.locator("#drawer")).not_to_be_in_viewport()
    expect(menu).to_be_focused()

    menu.click()
    page.locator("#new-chat").click()
    expect(page.locator(ANSWERS)).to_have_count(0)
    expect(page.locator("#drawer")).not_to_be_in_viewport()
    menu.click()
    entry.click()
    expect(page.locator(ANSWERS)).to_have_count(1)
    expect(page.locator("#drawer")).not_to_be_in_viewport()
    # Nothing on the desktop layout is a drawer.
    page.set_viewport_size(DESKTOP)
    expect(page.locator("#drawer")).to_be_in_viewport()
    expect(menu).to_be_hidden()


def test_dark_mode_follows_the_system_and_the_toggle_is_remembered(
    open_chat: Callable[..., Page], output_dir: Path
) -> None:
    """A dark system gets the dark theme, with no serious accessibility violation (AA contrast
    included); the toggle switches to light, and a reload keeps the student's choice."""
    page = open_in(open_chat, PHONE, "en-US", color_scheme="dark")
    background = "() => getComputedStyle(document.body).backgroundColor"
    assert page.evaluate(background) == "rgb(17, 24, 39)"
    theme = page.locator("#theme")
    expect(theme).to_have_attribute("aria-pressed", "true")
    wait_finished(ask(page, "[scripted tokens=5] Dark?"))
    page.screenshot(path=output_dir / "chat-en-US-dark.png")
    violations = axe_violations(page)  # colour contrast (AA) in the dark theme too
    assert not violations, format_violations(violations)
    theme.click()
    expect(theme).to_have_attribute("aria-pressed", "false")
    assert page.evaluate(background) == "rgb(246, 247, 251)"
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    assert page.evaluate(background) == "rgb(246, 247, 251)"
    expect(page.locator("#theme")).to_have_attribute("aria-pressed", "false")


def test_language_switcher_changes_the_page(open_chat: Callable[..., Page]) -> None:
    """An English browser picks 简体中文 in the switcher: the page reloads in Chinese and stays
    Chinese on the next visit."""
    page = open_in(open_chat, DESKTOP, "en-US")
    expect(page.locator("#send")).to_have_text("Send")
    page.locator("#language-select").select_option("zh-hans")
    expect(page.locator("#send")).to_have_text("发送")
    page.goto("/")
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")


def test_escape_stops_the_answer_and_only_the_finished_answer_is_announced(page: Page) -> None:
    """While an answer streams it is aria-busy and nothing is announced; Esc stops it. A finished
    answer is announced once, whole, in the one polite live region."""
    assert page.locator("[aria-live]").count() == 1
    answer = ask(page, "[scripted tokens=400 itl_ms=20] Stop me")
    expect(answer.locator(".body")).not_to_have_text("", timeout=5000)
    expect(answer).to_have_attribute("aria-busy", "true")
    expect(page.locator("#announcer")).to_have_text("")
    page.keyboard.press("Escape")
    wait_finished(answer)
    expect(page.locator("#status")).to_have_text("Stopped.")
    expect(answer).not_to_have_attribute("aria-busy", "true")

    done = ask(page, "[scripted tokens=3 itl_ms=5] Announce me")
    wait_finished(done)
    expect(page.locator("#announcer")).to_have_text(
        re.compile(r"^Answer ready\. " + re.escape(done.locator(".body").inner_text()))
    )


def test_the_view_stays_where_the_student_scrolled(page: Page) -> None:
    """The view follows a growing answer, but not once the student has scrolled up to read."""
    page.set_viewport_size({"width": 700, "height": 500})
    for n in range(3):
        wait_finished(ask(page, f"[scripted tokens=60 ttft_ms=0 itl_ms=0] Fill {n}"))
    answer = ask(page, "[scripted tokens=400 itl_ms=15] Grow")
    messages = page.locator("#messages")
    expect(answer.locator(".body")).not_to_have_text("", timeout=5000)
    messages.evaluate("(el) => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    page.wait_for_timeout(500)
    assert messages.evaluate("(el) => el.scrollTop") == 0
    page.keyboard.press("Escape")
    wait_finished(answer)


@pytest.fixture(scope="module")
def one_seat(daphne_factory) -> LiveServer:
    """Daphne whose engine streams one answer at a time: a second question, from anybody, is
    refused with 503 engine_busy and Retry-After."""
    return daphne_factory(CHATSITE_MAX_STREAMS="1", CHATSITE_PING_INTERVAL="15")


def _asked_while_another_streams(
    open_chat: Callable[..., Page], server: LiveServer, first_question: str
) -> tuple[Locator, Page]:
    """Two students on ``server``: the first is being answered ``first_question`` when the
    second asks (its refusal shows in its status line). The first's answer and the second's
    page."""
    first = open_in(open_chat, DESKTOP, "zh-CN", server=server)
    second = open_in(open_chat, DESKTOP, "zh-CN", server=server)
    running = ask(first, first_question)
    expect(running.locator(".body")).not_to_have_text("", timeout=5000)
    # Not ask(): the refused question's bubbles are gone before it could look for them.
    second.locator("#prompt").fill("[scripted tokens=3] 第二个")
    second.locator("#prompt").press("Enter")
    return running, second


def _answered_once_free(running: Locator, second: Page) -> None:
    """The second student's question is answered once the first answer is done, once."""
    wait_finished(running)
    answered = second.locator(ANSWERS).last
    expect(answered.locator(".body")).to_have_text(re.compile(r"\S"), timeout=15_000)
    wait_finished(answered)
    expect(second.locator(ANSWERS)).to_have_count(1)
    expect(second.locator("#messages .message.user")).to_have_count(1)
    expect(second.locator("#status")).to_have_text("")


def test_a_question_refused_for_a_full_engine_waits_for_a_free_seat(
    open_chat: Callable[..., Page], one_seat: LiveServer
) -> None:
    """The page says it waits for a free seat, how long so far and when it asks again, asks
    again by itself for as long as the engine is full, and is answered once a seat is free."""
    running, second = _asked_while_another_streams(
        open_chat, one_seat, "[scripted tokens=150 itl_ms=30] 第一个"
    )
    status = second.locator("#status")
    expect(status).to_have_text(re.compile(r"正在等待空位（已等 0 秒），\d+ 秒后自动重新提问"))
    # Refused again after its first wait: the time counts on from the first refusal.
    expect(status).to_have_text(re.compile(r"已等 [2-9] 秒"), timeout=10_000)
    _answered_once_free(running, second)


@pytest.fixture(scope="module")
def one_stream_per_address(daphne_factory) -> LiveServer:
    """Daphne allowing one answer at a time per client address (every test browser is
    127.0.0.1), so a second question is refused with 429 and Retry-After."""
    return daphne_factory(CHATSITE_STREAMS_PER_ADDRESS="1", CHATSITE_PING_INTERVAL="15")


def test_a_refused_question_waits_for_retry_after_and_asks_again(
    open_chat: Callable[..., Page], one_stream_per_address: LiveServer
) -> None:
    """A question refused with 429 and Retry-After shows the server's reason and a countdown,
    then is asked again by itself, and answered once the other answer is done."""
    running, second = _asked_while_another_streams(
        open_chat, one_stream_per_address, "[scripted tokens=100 itl_ms=20] 第一个"
    )
    status = second.locator("#status")
    expect(status).to_have_text(re.compile(r"你所在网络同时在接收的回答太多.*\d+ 秒后自动重新提问"))
    _answered_once_free(running, second)
