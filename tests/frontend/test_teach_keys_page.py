"""A class's API keys page in headless Chromium against a real Daphne, on a 390 px phone: the
page, with a key just made (shown once, long and unbroken) and one revoked, does not scroll
sideways and has no accessibility violations; the key the page shows answers the real API."""

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from assistant.models import ApiKey, Classroom
from assistant.services.api_keys import key_create
from assistant.services.teaching import class_create, teacher_create
from tests.frontend.axe import axe_violations, format_violations
from tests.frontend.conftest import TEACHER_PASSWORD
from tests.support import LiveServer, from_db

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def physics() -> Classroom:
    def make() -> Classroom:
        teacher = teacher_create(username="lin", password=TEACHER_PASSWORD)
        classroom = class_create(
            name="Physics 7A — a long class name for a small screen", teacher=teacher
        )
        old, _ = key_create(
            name="A notebook the class used last term, long ago",
            classroom=classroom,
            created_by=teacher,
        )
        old.revoked_at = old.created_at
        old.save(update_fields=["revoked_at"])
        return classroom

    return from_db(make)


def fits_the_phone(page: Page) -> None:
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{page.url} is {width}px wide"
    violations = axe_violations(page)
    assert not violations, format_violations(violations)


def test_the_keys_page_fits_a_phone_before_and_after_a_key_is_made(
    teacher_browser: Callable[..., Page], physics: Classroom, daphne: LiveServer, output_dir: Any
) -> None:
    page = teacher_browser(f"/teach/{physics.id}/", viewport=PHONE, locale="en-US")
    page.locator("#class-keys").click()
    page.wait_for_url(f"**/teach/{physics.id}/keys")
    fits_the_phone(page)
    page.fill("#id_name", "Lab notebook")
    page.fill("#id_rate", "20")
    page.locator("#key-new button[type='submit']").click()
    key = page.locator("#new-key")
    expect(key).to_be_visible()
    page.screenshot(path=output_dir / "teach-keys-phone.png", full_page=True)
    fits_the_phone(page)
    text = key.inner_text()
    assert from_db(lambda: ApiKey.objects.get(name="Lab notebook").prefix) in text
    answer = httpx.get(f"{daphne.url}/v1/models", headers={"Authorization": f"Bearer {text}"})
    assert answer.status_code == 200
