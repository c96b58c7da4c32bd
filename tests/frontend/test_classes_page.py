"""Students and classes in headless Chromium against a real Daphne serving the scripted engine:
joining by link and by typed code, the class banner and what it says teachers can see, the
class's persona and answer length reaching the engine, a paused class, leaving, a wrong code.

Each browser context comes from an address of its own (``X-Forwarded-For`` from loopback, a
trusted proxy, as nginx sends it), so wrong-code tries per address (``JOIN_TRIES_PER_MINUTE``)
made by other tests in the same minute cannot refuse these joins.
"""

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone, translation
from playwright.sync_api import Browser, Locator, Page, expect

from assistant import errors
from assistant.engines.scripted import default_tokens
from assistant.models import ClassMember, Classroom, Conversation
from assistant.services.classrooms import CLASS_COOKIE, join_code_new
from tests.frontend.test_chat_page import ask, wait_finished
from tests.support import LiveServer, from_db, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PERSONA = "You are a patient physics tutor who never hands out homework answers."
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 800}
READ_TEXT = "can read the questions you ask"
NOT_READ_TEXT = "not what you ask"


def make_class(**fields: Any) -> Classroom:
    """A class with a fresh join code, created on a database thread (``from_db``)."""
    name = fields.pop("name", "Physics 8A")
    return from_db(lambda: Classroom.objects.create(name=name, join_code=join_code_new(), **fields))


def english(message: Any) -> str:
    with translation.override("en"):
        return str(message)


@pytest.fixture
def open_page(browser: Browser, daphne: LiveServer) -> Iterator[Callable[..., Page]]:
    """Open ``path`` in a new context, as a student's first visit (keyword arguments go to
    ``new_context``). Uncaught exceptions in any page fail the test."""
    contexts = []
    problems: list[Exception] = []

    def open_at(path: str, **context_args: Any) -> Page:
        context_args.setdefault("viewport", DESKTOP)
        context_args.setdefault("locale", "en-US")
        number = uuid.uuid4().int
        address = f"198.18.{number % 250 + 1}.{number // 250 % 250 + 1}"
        context = browser.new_context(
            base_url=daphne.url, extra_http_headers={"X-Forwarded-For": address}, **context_args
        )
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(error))
        page.goto(path)
        return page

    yield open_at
    for context in contexts:
        context.close()
    assert not problems, f"uncaught errors in the page: {problems}"


def submit_and_land(page: Page, daphne: LiveServer) -> None:
    """Submit ``form#join`` and wait for the chat page it redirects to, ready."""
    page.locator("form#join button[type='submit']").click()
    page.wait_for_url(f"{daphne.url}/")
    page.wait_for_selector("body[data-ready='1']", state="attached")


def members(classroom: Classroom) -> list[dict[str, Any]]:
    return from_db(
        lambda: list(
            ClassMember.objects.filter(classroom=classroom).values(
                "nickname", "owner_key", "left_at"
            )
        )
    )


@pytest.mark.parametrize(
    ("locale", "viewport", "nickname"),
    [("zh-CN", PHONE, "小明"), ("en-US", DESKTOP, "Mei")],
    ids=["zh-CN", "en-US"],
)
def test_a_student_joins_by_link_and_the_class_persona_answers(
    open_page: Callable[..., Page],
    daphne: LiveServer,
    output_dir: Path,
    locale: str,
    viewport: dict[str, int],
    nickname: str,
) -> None:
    """A first visit to ``/c/<code>`` shows the class and its policy; joining with a nickname
    lands on the chat page under the class's banner, and a question reaches the engine with the
    class's persona as its system message and is cut to the class's 5 tokens."""
    classroom = make_class(name="Physics 8A", persona=PERSONA, max_tokens=5)
    page = open_page(f"/c/{classroom.join_code}", locale=locale, viewport=viewport)
    expect(page.locator("#join-error")).to_have_count(0)
    expect(page.locator("#class-name")).to_have_text("Physics 8A")
    expect(page.locator("#class-policy")).to_have_attribute("data-teachers-read", "false")
    page.locator("#nickname").fill(nickname)
    page.screenshot(path=output_dir / f"class-join-{locale}.png", full_page=True)

    submit_and_land(page, daphne)
    banner = page.locator("#class-banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Physics 8A")
    expect(banner.locator("#class-policy")).to_be_visible()
    expect(page.locator("#class-paused")).to_have_count(0)
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    assert cookies.get(CLASS_COOKIE) == str(classroom.id)

    tag = f"join-{locale}-{uuid.uuid4().hex[:10]}"
    answer = ask(page, f"[scripted tokens=20 ttft_ms=0 tag={tag}] Why does a ball keep rolling?")
    wait_finished(answer)
    # The engine would say 20 tokens; the class allows 5.
    expect(answer.locator(".body")).to_have_text("".join(default_tokens(5)))
    expect(page.locator("#status")).to_have_text("")
    page.screenshot(path=output_dir / f"class-chat-{locale}.png", full_page=True)

    start = daphne.wait_engine_event(tag, "start")
    assert start["given"][0] == ["system", PERSONA]
    assert start["params"]["max_tokens"] == 5

    (member,) = members(classroom)
    assert member["nickname"] == nickname
    assert member["left_at"] is None
    # The member row is this browser's: the conversation it just had belongs to the same owner.
    conversations = wait_for(
        lambda: from_db(
            lambda: list(Conversation.objects.filter(classroom=classroom).values("owner_key"))
        )
    )
    assert conversations == [{"owner_key": member["owner_key"]}]


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_a_typed_code_joins_and_the_sidebar_button_leaves(
    open_page: Callable[..., Page], daphne: LiveServer, viewport: dict[str, int]
) -> None:
    """A code typed at ``/c/`` in lower case with spaces joins its class; the sidebar's Leave
    button (in the drawer on a phone) takes the student out: no banner, the Join link back, and
    the member row marked as left."""
    classroom = make_class(name="Chemistry 9B")
    code = classroom.join_code
    typed = f" {code[:2].lower()} {code[2:].lower()} "
    page = open_page("/c/", viewport=viewport)
    expect(page.locator("#class-name")).to_have_count(0)
    page.locator("#code").fill(typed)
    page.locator("#nickname").fill("Ana")
    submit_and_land(page, daphne)
    expect(page.locator("#class-banner")).to_contain_text("Chemistry 9B")
    assert [m["nickname"] for m in members(classroom)] == ["Ana"]

    if viewport["width"] < 768:  # the sidebar is a drawer
        leave = page.locator("form#leave-class button[type='submit']")
        expect(leave).to_be_hidden()
        page.locator("#menu").click()
    leave = page.locator("form#leave-class button[type='submit']")
    expect(leave).to_be_visible()
    leave.click()
    page.wait_for_url(f"{daphne.url}/")
    page.wait_for_selector("body[data-ready='1']", state="attached")

    expect(page.locator("#class-banner")).to_have_count(0)
    expect(page.locator("form#leave-class")).to_have_count(0)
    if viewport["width"] < 768:  # the sidebar is a drawer
        page.locator("#menu").click()
    join_link = page.locator("#join-class")
    expect(join_link).to_be_visible()
    expect(join_link).to_have_attribute("href", "/c/")
    cookies = {c["name"] for c in page.context.cookies()}
    assert CLASS_COOKIE not in cookies
    (member,) = members(classroom)
    assert member["left_at"] is not None


def test_a_paused_class_is_told_and_gets_no_answer(
    open_page: Callable[..., Page], daphne: LiveServer
) -> None:
    """In a paused class the banner says so, a question gets the server's ``class_paused``
    message and no answer text, and the engine never starts; opened again, it answers."""
    classroom = make_class(name="History 7C", paused=True)
    page = open_page(f"/c/{classroom.join_code}")
    expect(page.locator("#class-paused")).to_be_visible()
    submit_and_land(page, daphne)
    expect(page.locator("#class-banner #class-paused")).to_be_visible()

    tag = f"paused-{uuid.uuid4().hex[:10]}"
    answer = ask(page, f"[scripted tokens=5 ttft_ms=0 tag={tag}] When did Rome fall?")
    wait_finished(answer)
    status = page.locator("#status")
    expect(status).to_have_text(english(errors.CLASS_PAUSED.message))
    expect(status).to_have_class("error")
    expect(answer.locator(".body")).to_have_text("")
    expect(answer.locator(".note")).to_have_text("No answer was produced.")
    # Any start would have been recorded before the refusal reached the page; a little slack
    # for the file to be written all the same.
    page.wait_for_timeout(300)
    assert [e for e in daphne.engine_events(tag) if e["event"] == "start"] == []

    # The same student in the same class, opened again: the tag now starts the engine.
    def reopen() -> None:
        row = Classroom.objects.get(id=classroom.id)
        row.paused = False
        row.save(update_fields=["paused", "updated_at"])

    from_db(reopen)
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    expect(page.locator("#class-banner")).to_contain_text("History 7C")
    expect(page.locator("#class-paused")).to_have_count(0)
    tag = f"reopened-{uuid.uuid4().hex[:10]}"
    answer = ask(page, f"[scripted tokens=5 ttft_ms=0 tag={tag}] When did Rome fall?")
    wait_finished(answer)
    expect(answer.locator(".body")).to_have_text("".join(default_tokens(5)))
    daphne.wait_engine_event(tag, "start")


def test_a_page_left_open_while_the_teacher_starts_reading_asks_nothing(
    open_page: Callable[..., Page], daphne: LiveServer
) -> None:
    """The page said the teacher cannot read; the teacher turns reading on; a question from
    that page is refused with the server's ``class_changed`` message (no engine start), and
    after a reload the banner says what holds now and questions are answered."""
    classroom = make_class(name="Art 8", teachers_read=False)
    page = open_page(f"/c/{classroom.join_code}")
    submit_and_land(page, daphne)
    expect(page.locator("#class-banner #class-policy")).to_contain_text(NOT_READ_TEXT)

    def start_reading() -> None:
        row = Classroom.objects.get(id=classroom.id)
        row.teachers_read = True
        row.save(update_fields=["teachers_read", "updated_at"])

    from_db(start_reading)
    tag = f"stale-{uuid.uuid4().hex[:10]}"
    answer = ask(page, f"[scripted tokens=5 ttft_ms=0 tag={tag}] What is chiaroscuro?")
    wait_finished(answer)
    expect(page.locator("#status")).to_have_text(english(errors.CLASS_CHANGED.message))
    expect(answer.locator(".body")).to_have_text("")
    page.wait_for_timeout(300)
    assert [e for e in daphne.engine_events(tag) if e["event"] == "finish"] == []

    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    expect(page.locator("#class-banner #class-policy")).to_contain_text(READ_TEXT)
    tag = f"fresh-{uuid.uuid4().hex[:10]}"
    answer = ask(page, f"[scripted tokens=5 ttft_ms=0 tag={tag}] What is chiaroscuro?")
    wait_finished(answer)
    expect(answer.locator(".body")).to_have_text("".join(default_tokens(5)))


@pytest.mark.parametrize("teachers_read", [True, False], ids=["teachers-read", "private"])
def test_the_banner_says_what_the_teacher_can_see(
    open_page: Callable[..., Page], daphne: LiveServer, teachers_read: bool
) -> None:
    """The join page and the chat page's banner both state the class's visibility setting, in
    its attribute and in words that differ between the two settings."""
    classroom = make_class(name="Biology 10", teachers_read=teachers_read)
    expected, other = (READ_TEXT, NOT_READ_TEXT) if teachers_read else (NOT_READ_TEXT, READ_TEXT)
    page = open_page(f"/c/{classroom.join_code}")

    def check(policy: Locator) -> None:
        expect(policy).to_be_visible()
        expect(policy).to_have_attribute("data-teachers-read", str(teachers_read).lower())
        expect(policy).to_contain_text(expected)
        expect(policy).not_to_contain_text(other)

    check(page.locator("#class-policy"))
    submit_and_land(page, daphne)
    check(page.locator("#class-banner #class-policy"))


@pytest.mark.parametrize("case", ["unknown", "expired"])
def test_a_wrong_code_is_refused_and_the_form_still_joins(
    open_page: Callable[..., Page], daphne: LiveServer, case: str
) -> None:
    """A code that opens no class (404), or one that expired (410), shows ``#join-error`` with
    the server's message and joins nothing; the same form then joins with the right code."""
    right = make_class(name="Maths 6")
    if case == "unknown":
        # O and 1 are never in a code (CODE_ALPHABET).
        wrong, status, message = "OO11OO", 404, errors.JOIN_CODE_UNKNOWN.message
    else:
        expired = make_class(
            name="Old class", code_expires_at=timezone.now() - timedelta(minutes=1)
        )
        wrong, status, message = expired.join_code, 410, errors.JOIN_CODE_EXPIRED.message
    page = open_page("/c/")
    page.locator("#code").fill(wrong)
    page.locator("#nickname").fill("Sam")
    with page.expect_response(lambda r: r.request.method == "POST") as refused:
        page.locator("form#join button[type='submit']").click()
    assert refused.value.status == status
    page.wait_for_load_state()

    error = page.locator("#join-error")
    expect(error).to_be_visible()
    expect(error).to_have_text(english(message))
    expect(page.locator("#class-name")).to_have_count(0)
    assert from_db(lambda: ClassMember.objects.count()) == 0

    # Still usable: the form is there, keeps the nickname, and joins with the right code.
    expect(page.locator("#nickname")).to_have_value("Sam")
    page.locator("#code").fill(right.join_code)
    submit_and_land(page, daphne)
    expect(page.locator("#class-banner")).to_contain_text("Maths 6")
    assert [m["nickname"] for m in members(right)] == ["Sam"]
