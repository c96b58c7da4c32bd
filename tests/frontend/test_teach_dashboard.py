"""The teacher's live dashboard in headless Chromium against a real Daphne: a teacher logs in
through the form, a student asks in the class, and the class's row shows the question without a
reload; the page in Chinese fits a 390 px phone. Screenshots of both go to ``test-output/``."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from assistant.models import Classroom
from assistant.services.teaching import class_create, teacher_create
from tests.frontend.conftest import TEACHER_PASSWORD
from tests.support import ChatClient, LiveServer, from_db

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = TEACHER_PASSWORD
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def physics() -> Classroom:
    """Lin's class (the default password hasher: Daphne checks the password at login)."""

    def make() -> Classroom:
        teacher = teacher_create(username="lin", password=PASSWORD)
        return class_create(name="Physics 7A — 物理七年级 A 班", teacher=teacher)

    return from_db(make)


@pytest.fixture
def dashboard(teacher_browser: Callable[..., Page]) -> Callable[..., Page]:
    """The dashboard in a browser logged in through /teach/login/."""
    return lambda **context_args: teacher_browser("/teach/dashboard/", **context_args)


def student_asks(server: LiveServer, classroom: Classroom, question: str) -> list[Any]:
    """A student joins the class with its code, as the join form does, and asks."""
    student = ChatClient(server)
    try:
        joined = student.client.post(
            "/c/",
            data={
                "code": classroom.join_code,
                "nickname": "Ada",
                "csrfmiddlewaretoken": student.csrf_token,
            },
        )
        assert joined.status_code == 302, joined.text
        return student.ask(question)
    finally:
        student.close()


def figure(page: Page, classroom: Classroom, name: str) -> Any:
    return page.locator(f'#class-figures tr[data-class="{classroom.id}"] [data-figure="{name}"]')


def test_a_question_shows_on_the_dashboard_without_a_reload(
    dashboard: Callable[..., Page], daphne: LiveServer, physics: Classroom, output_dir: Path
) -> None:
    """The page asks for new figures every 3 s: a student's question appears in the class's
    row, in the same document, and the figures' status line stays empty."""
    page = dashboard(viewport=DESKTOP, locale="en-US")
    expect(page.locator("h1")).to_have_text("Your classes, live")
    expect(figure(page, physics, "questions")).to_have_text("0")
    expect(figure(page, physics, "active")).to_have_text("0")
    page.evaluate("() => { window.sameDocument = true; }")
    events = student_asks(daphne, physics, "[scripted tokens=5 ttft_ms=0] Why is the sky blue?")
    assert events[-1].event == "done"
    expect(figure(page, physics, "questions")).to_have_text("1", timeout=15_000)
    expect(figure(page, physics, "active")).to_have_text("1")
    expect(figure(page, physics, "errors")).to_have_text("0")
    assert page.evaluate("() => window.sameDocument") is True
    expect(page.locator("#figures-status")).to_have_text("")
    page.screenshot(path=output_dir / "teach-dashboard-en-US.png")


def test_the_dashboard_in_chinese_fits_a_phone(
    dashboard: Callable[..., Page], daphne: LiveServer, physics: Classroom, output_dir: Path
) -> None:
    """In Chinese on a 390 px phone the page does not scroll sideways: the table scrolls in its
    own box."""
    student_asks(daphne, physics, "[scripted tokens=3 ttft_ms=0] 为什么天空是蓝色的？")
    page = dashboard(viewport=PHONE, locale="zh-CN")
    expect(page.locator("h1")).to_have_text("你的班级（实时）")
    expect(figure(page, physics, "questions")).to_have_text("1")
    expect(page.locator(f'#class-figures tr[data-class="{physics.id}"] th a').first).to_have_text(
        physics.name
    )
    scroll = page.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
    assert scroll[0] <= scroll[1] == PHONE["width"], f"the page is {scroll[0]}px wide"
    page.screenshot(path=output_dir / "teach-dashboard-zh-CN.png")
