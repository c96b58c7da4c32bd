"""Headless Chromium for the page tests: a fresh browser for each test.

Each test gets its own browser, so its own cookies and therefore its own session and
conversations on the shared Daphne server.
"""

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from assistant.benchmarking.servers import CHROMIUM_ARGS, chromium_executable
from tests.support import LiveServer


@pytest.fixture
def browser() -> Iterator[Browser]:
    # One per test, although a launch costs about a second: while Playwright's sync API is
    # started, its event loop counts as running in this thread, and Django then refuses the
    # database flush that ends each transactional test. Torn down first, it is gone by then.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_executable(), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def open_chat(browser: Browser, daphne: LiveServer) -> Iterator[Callable[..., Page]]:
    """Open the chat page in a new context (keyword arguments go to ``new_context``; ``server``
    serves it, the shared Daphne unless given).

    Uncaught exceptions in the page fail the test.
    """
    contexts = []
    errors: list[Exception] = []

    def open_page(*, server: LiveServer = daphne, **context_args: Any) -> Page:
        context_args.setdefault("viewport", {"width": 1100, "height": 800})
        context = browser.new_context(base_url=server.url, **context_args)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(error))
        page.goto("/")
        page.wait_for_selector("body[data-ready='1']", state="attached")
        return page

    yield open_page
    for context in contexts:
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture
def page(open_chat: Callable[..., Page]) -> Page:
    """The chat page, loaded and ready, in its own browser context."""
    return open_chat()


#: The password of the teachers the page tests make.
TEACHER_PASSWORD = "pw-long-enough-123"


@pytest.fixture
def teacher_browser(browser: Browser, daphne: LiveServer) -> Iterator[Callable[..., Page]]:
    """Open a teacher's page in a new context, logged in on the way through the login form
    (``/teach/login/``, as username ``lin`` unless told otherwise; keyword arguments go to
    ``new_context``). Uncaught exceptions in the page fail the test."""
    contexts = []
    problems: list[Exception] = []

    def open_as_teacher(path: str, *, username: str = "lin", **context_args: Any) -> Page:
        context = browser.new_context(base_url=daphne.url, **context_args)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(error))
        page.goto(path)
        page.fill("#id_username", username)
        page.fill("#id_password", TEACHER_PASSWORD)
        page.locator("form#login button[type='submit']").click()
        page.wait_for_url(f"{daphne.url}{path}")
        return page

    yield open_as_teacher
    for context in contexts:
        context.close()
    assert not problems, f"uncaught errors in the page: {problems}"
