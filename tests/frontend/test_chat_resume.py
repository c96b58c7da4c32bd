"""A network drop mid-answer in headless Chromium: the page resumes and the answer completes,
every word exactly once. The drop is real: the page talks to the server through a TCP relay
that cuts every open connection at once."""

import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from assistant.engines.scripted import default_tokens
from tests.frontend.test_chat_page import ask, wait_finished
from tests.support import LiveServer, ThreadedCountingProxy

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def resumable_server(daphne_factory) -> LiveServer:
    return daphne_factory(CHATSITE_RESUME_GRACE_S="10")


@pytest.fixture
def relayed_page(
    browser: Browser, resumable_server: LiveServer
) -> Iterator[tuple[Page, ThreadedCountingProxy]]:
    with ThreadedCountingProxy(resumable_server.port) as relay:
        context = browser.new_context(base_url=relay.url)
        page = context.new_page()
        errors: list[Exception] = []
        page.on("pageerror", lambda error: errors.append(error))
        page.goto("/")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        yield page, relay
        context.close()
        assert not errors, errors


def body_text(page: Page) -> str:
    return page.locator("#messages .message.assistant .body").last.text_content() or ""


def test_a_dropped_answer_resumes_without_losing_or_repeating_a_word(
    relayed_page: tuple[Page, ThreadedCountingProxy],
) -> None:
    page, relay = relayed_page
    full = "".join(default_tokens(40))
    answer = ask(page, "[scripted tokens=40 itl_ms=60] Tell me about cells.")
    deadline = time.monotonic() + 10
    while len(body_text(page)) < len("".join(default_tokens(6))):
        assert time.monotonic() < deadline, "the answer never started"
        page.wait_for_timeout(20)
    # Rendered as markdown while it streams: a paragraph, whose text may end in a line break.
    before = body_text(page).rstrip("\n")
    connections = relay.accepted
    relay.drop()
    expect(page.locator("#status")).to_contain_text("Reconnecting", timeout=5000)
    wait_finished(answer)
    expect(answer.locator(".body")).to_have_text(full)
    assert full.startswith(before) and len(before) < len(full)
    assert relay.accepted > connections  # it really came back over a new connection
    assert "partial" not in (answer.get_attribute("class") or "")


def test_a_resume_too_late_shows_what_was_saved(browser: Browser, daphne: LiveServer) -> None:
    """With resuming off on the server, the page's resume is refused; it keeps the words it
    had and says the answer stopped."""
    with ThreadedCountingProxy(daphne.port) as relay:
        context = browser.new_context(base_url=relay.url)
        page = context.new_page()
        page.goto("/")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        answer = ask(page, "[scripted tokens=60 itl_ms=50] Tell me about atoms.")
        deadline = time.monotonic() + 10
        while len(body_text(page)) < len("".join(default_tokens(4))):
            assert time.monotonic() < deadline, "the answer never started"
            page.wait_for_timeout(20)
        relay.drop()
        wait_finished(answer)
        text = body_text(page).strip()
        context.close()
    full = "".join(default_tokens(60))
    assert text and full.startswith(text) and len(text) < len(full)


def test_stop_ends_the_answer_although_a_drop_would_be_resumed(
    browser: Browser, resumable_server: LiveServer
) -> None:
    """With a resume grace of 10 s, Stop still ends the generation at once: the page asks
    POST /api/chat/stop (204) before it closes the stream, and the engine is cancelled within
    2 s instead of generating on for a resume."""
    import uuid

    context = browser.new_context(base_url=resumable_server.url)
    page = context.new_page()
    page.goto("/")
    page.wait_for_selector("body[data-ready='1']", state="attached")
    tag = f"stop-grace-{uuid.uuid4().hex[:12]}"
    answer = ask(page, f"[scripted tokens=400 itl_ms=50 tag={tag}] Tell me all about plants.")
    body = answer.locator(".body")
    page.wait_for_function(
        "(el) => el.textContent.split(' ').length >= 5", arg=body.element_handle()
    )
    with page.expect_response("**/api/chat/stop") as stopped:
        clicked = time.monotonic()
        page.locator("#stop").click()

    assert stopped.value.status == 204
    expect(page.locator("#status")).to_have_text("Stopped.")
    cancelled = resumable_server.wait_engine_event(tag, "cancel")
    assert cancelled["t"] - clicked < 2, "the engine kept generating after Stop"
    assert cancelled["tokens"] < 400
    context.close()
