"""The teachers' pages in headless Chromium against a real Daphne: a teacher logs in through the
form, and on a 390 px phone no page scrolls sideways; a persona example goes into the persona
box with a click; the code's expiry is typed and shown in the teacher's own time zone."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from assistant.models import Classroom
from assistant.services.teaching import class_create, teacher_create
from assistant.teach_forms import PERSONA_EXAMPLES
from tests.frontend.axe import axe_violations, format_violations
from tests.frontend.conftest import TEACHER_PASSWORD
from tests.support import from_db

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = TEACHER_PASSWORD
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def physics() -> Classroom:
    def make() -> Classroom:
        teacher = teacher_create(username="lin", password=PASSWORD)
        classroom = class_create(
            name="Physics 7A — a long class name for a small screen", teacher=teacher
        )
        return classroom

    return from_db(make)


@pytest.fixture
def teacher_page(teacher_browser: Callable[..., Page]) -> Callable[..., Page]:
    """The class list on a phone, in English unless told otherwise, logged in through
    /teach/login/."""

    def open_list(**context_args: Any) -> Page:
        context_args.setdefault("viewport", PHONE)
        context_args.setdefault("locale", "en-US")
        return teacher_browser("/teach/", **context_args)

    return open_list


def no_sideways_scroll(page: Page) -> None:
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{page.url} is {width}px wide"


def test_every_teacher_page_fits_a_phone(teacher_page, physics: Classroom) -> None:
    page = teacher_page()
    for path in ("/teach/", "/teach/new", f"/teach/{physics.id}/", "/teach/password/"):
        page.goto(path)
        no_sideways_scroll(page)
        violations = axe_violations(page)
        assert not violations, format_violations(violations)


def test_a_persona_example_goes_into_the_persona_box(
    teacher_page, physics: Classroom, output_dir
) -> None:
    page = teacher_page(viewport={"width": 1280, "height": 900})
    page.goto(f"/teach/{physics.id}/")
    page.screenshot(path=output_dir / "teach-class-en-US.png", full_page=True)
    buttons = page.locator("[data-persona-use]")
    expect(buttons).to_have_count(2 * len(PERSONA_EXAMPLES))
    buttons.nth(1).click()  # the first example, in Chinese
    expect(page.locator("#id_persona")).to_have_value(PERSONA_EXAMPLES[0].zh)
    page.locator("#class-settings button[type='submit']").click()
    expect(page.locator("#id_persona")).to_have_value(PERSONA_EXAMPLES[0].zh)
    stored = from_db(lambda: Classroom.objects.get(id=physics.id).persona)
    assert stored == PERSONA_EXAMPLES[0].zh


def test_the_expiry_is_in_the_teachers_time_zone(teacher_page, physics: Classroom) -> None:
    """Typed 08:30 in Shanghai is stored as 00:30 UTC, and shown again as 08:30."""
    page = teacher_page(timezone_id="Asia/Shanghai")
    page.goto(f"/teach/{physics.id}/")
    page.fill("#id_code_expires_at", "2030-01-02T08:30")
    page.locator("#class-settings button[type='submit']").click()
    expect(page.locator("#code-expires")).to_be_visible()
    stored = from_db(lambda: Classroom.objects.get(id=physics.id).code_expires_at)
    assert stored == datetime(2030, 1, 2, 0, 30, tzinfo=UTC)
    expect(page.locator("#id_code_expires_at")).to_have_value("2030-01-02T08:30")
    expect(page.locator("#code-expires time")).to_contain_text("8:30")
