"""The page reports its own timings of every request, answered or not (headless Chromium)."""

import pytest
from playwright.sync_api import Page

from assistant.models import StreamRecord
from tests.frontend.test_chat_page import ask, wait_finished
from tests.support import from_db, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def reported(request_id: str) -> StreamRecord:
    """The record once the browser's report has joined it. Queried from a worker thread:
    Playwright's sync API runs an event loop in the test's thread, where Django refuses ORM."""

    def lookup() -> StreamRecord | None:
        rows = StreamRecord.objects.filter(request_id=request_id, client_reported_at__isnull=False)
        return rows.first()

    return wait_for(lambda: from_db(lookup), timeout=10)


def test_an_answer_is_reported_with_the_browsers_timings(page: Page) -> None:
    answer = ask(page, "[scripted tokens=6 ttft_ms=150 itl_ms=40] What is a cell?")
    wait_finished(answer)
    record = reported(answer.get_attribute("data-request-id"))
    assert record.client_outcome == "ok"
    assert record.client_tokens == 6
    # The browser waited at least the engine's 150 ms, and saw the stages in order.
    assert 150 <= record.client_ttft_ms < 2000
    assert record.client_ttfb_ms <= record.client_ttft_ms <= record.client_done_ms
    assert record.client_ttft_ms >= record.server_ttft_ms - 1
    assert 30 <= record.client_itl_mean_ms <= record.client_itl_max_ms


def test_stop_before_the_first_token_is_reported_as_time_waited(page: Page) -> None:
    answer = ask(page, "[scripted tokens=3 ttft_ms=4000] Think slowly.")
    page.wait_for_timeout(700)
    page.locator("#stop").click()
    record = reported(answer.get_attribute("data-request-id"))
    assert record.client_outcome == "stopped"
    assert record.client_ttft_ms is None
    assert 650 <= record.client_waited_ms < 3000
    assert record.outcome == "client_abort"


def test_closing_the_tab_mid_answer_still_reports(open_chat) -> None:
    page = open_chat()
    answer = ask(page, "[scripted tokens=200 itl_ms=30] A long story.")
    page.wait_for_function(
        "(el) => el.querySelector('.body').textContent.length > 20", arg=answer.element_handle()
    )
    request_id = answer.get_attribute("data-request-id")
    page.close(run_before_unload=True)
    record = reported(request_id)
    assert record.client_outcome == "abandoned"
    assert record.client_tokens >= 2
    assert record.client_ttft_ms is not None
