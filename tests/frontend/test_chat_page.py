"""The chat page in headless Chromium against a real Daphne serving the scripted engine.

Every request chooses its own behaviour with a ``[scripted ...]`` directive at the start of the
question (see ``assistant.engines.scripted``); the page shows the directive as part of the
question, which is harmless. Custom answers pass ``text=`` a JSON string, which the engine sends
one character per token.
"""

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from assistant.engines.scripted import default_tokens
from tests.support import LiveServer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ANSWERS = "#messages .message.assistant"
# The text of each question (its bubble also holds its buttons).
QUESTIONS = "#messages .message.user .body"
STREAMING = re.compile(r"\bstreaming\b")
# Any attribute that could run script, or a URL that would.
UNSAFE_IN_BUBBLE = """(el) => [...el.querySelectorAll('*')].flatMap((node) => [
    ...(['SCRIPT', 'IFRAME', 'OBJECT', 'EMBED'].includes(node.tagName) ? [node.outerHTML] : []),
    ...[...node.attributes]
        .filter((a) => a.name.startsWith('on') || /^\\s*javascript:/i.test(a.value))
        .map((a) => `${node.tagName} ${a.name}=${a.value}`),
])"""


def ask(page: Page, question: str) -> Locator:
    """Type ``question``, press Enter, and return the bubble its answer will appear in."""
    answers = page.locator(ANSWERS)
    before = answers.count()
    prompt = page.locator("#prompt")
    prompt.fill(question)
    prompt.press("Enter")
    answer = answers.nth(before)
    expect(answer).to_be_attached()
    return answer


def wait_finished(answer: Locator, timeout_ms: float = 15_000) -> None:
    expect(answer).not_to_have_class(STREAMING, timeout=timeout_ms)


def test_answer_streams_token_by_token(page: Page, output_dir: Path) -> None:
    """Enter sends the question; the answer grows word by word, then settles as markdown."""
    full = "".join(default_tokens(25))
    answer = ask(page, "[scripted tokens=25 itl_ms=80] What is photosynthesis?")

    seen: list[str] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text, streaming = answer.evaluate(
            "(el) => [el.querySelector('.body').textContent, el.classList.contains('streaming')]"
        )
        if not streaming:
            break
        seen.append(text)
        page.wait_for_timeout(15)
    else:
        pytest.fail(f"the answer was still streaming after 15 s: {seen[-1:]}")

    # Rendered as markdown while it streams: a paragraph, whose text may end in a line break.
    seen = [text.rstrip("\n") for text in seen]
    intermediate = [t for t in dict.fromkeys(seen) if 0 < len(t) < len(full)]
    assert len(intermediate) >= 5, f"the answer did not appear progressively: {intermediate}"
    assert all(full.startswith(t) for t in intermediate), intermediate
    lengths = [len(t) for t in intermediate]
    assert lengths == sorted(lengths), "the streamed text went backwards"

    body = answer.locator(".body")
    expect(body).to_have_text(full)
    # Rendered from markdown: one paragraph element, not the bare streamed text.
    expect(body.locator(":scope > p")).to_have_text(full)
    assert answer.evaluate(UNSAFE_IN_BUBBLE) == []
    expect(page.locator(QUESTIONS).last).to_have_text(
        "[scripted tokens=25 itl_ms=80] What is photosynthesis?"
    )
    expect(page.locator("#status")).to_have_text("")
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()
    page.screenshot(path=output_dir / "chat-page.png", full_page=True)


def test_markdown_answer_renders_as_formatted_html(page: Page) -> None:
    """Markdown is rendered while the answer streams (bold and code appear before it is done),
    and is the same formatted HTML once finished."""
    markdown = r"Plants need **light** and `water`.\n\n- roots\n- leaves"
    answer = ask(page, f"[scripted itl_ms=40 text='\"{markdown}\"'] Format a short answer.")
    # Each character is one token: the bold word is formatted long before the list arrives.
    expect(answer.locator(".body strong")).to_have_text("light")
    streaming, shown = answer.evaluate(
        "(el) => [el.classList.contains('streaming'), el.querySelector('.body').textContent]"
    )
    assert streaming, "the answer was done before it was checked"
    assert "**" not in shown and "Plants need light" in shown, shown
    wait_finished(answer)

    body = answer.locator(".body")
    expect(body.locator("strong")).to_have_text("light")
    expect(body.locator("code")).to_have_text("water")
    expect(body.locator("ul > li")).to_have_text(["roots", "leaves"])
    expect(body).not_to_contain_text("**")
    expect(page.locator("#status")).to_have_text("")


def test_stop_button_stops_a_long_answer(page: Page, daphne: LiveServer) -> None:
    """Stop ends the answer at once: "Stopped.", a partial answer, and the engine cancelled."""
    tag = f"stop-{uuid.uuid4().hex[:12]}"
    full = "".join(default_tokens(400))
    answer = ask(page, f"[scripted tokens=400 itl_ms=50 tag={tag}] Tell me all about plants.")
    body = answer.locator(".body")
    stop = page.locator("#stop")
    expect(stop).to_be_visible()
    page.wait_for_function(
        "(el) => el.textContent.split(' ').length >= 5", arg=body.element_handle()
    )
    clicked = time.monotonic()
    stop.click()

    expect(page.locator("#status")).to_have_text("Stopped.")
    expect(answer.locator(".note")).to_have_text("Answer cut short.")
    expect(stop).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#retry")).to_be_hidden()
    partial = body.inner_text().strip()
    assert len(partial.split(" ")) >= 5
    assert len(partial) < len(full) / 2
    assert full.startswith(partial)

    # The engine stopped generating too (both clocks are the machine's monotonic clock).
    cancelled = daphne.wait_engine_event(tag, "cancel")
    assert cancelled["t"] - clicked < 2, "the engine kept generating after Stop"
    assert not [e for e in daphne.engine_events(tag) if e["event"] == "finish"]
    # The page shows no more words than the engine produced.
    assert len(partial.split(" ")) <= cancelled["tokens"] < 400


def test_no_first_byte_in_5_seconds_offers_retry(page: Page) -> None:
    """An endpoint that never answers is given up on after 5 s (not before), with Retry."""
    pending: list[Route] = []
    # Hold every request to the stream endpoint forever: no response, no error.
    page.route("**/api/chat/stream", lambda route: pending.append(route))

    answer = ask(page, "[scripted tokens=4] Is anyone there?")
    started = time.monotonic()
    status = page.locator("#status")
    expect(status).to_have_text("Waiting for the first word…")
    page.wait_for_function(
        "() => document.getElementById('status').textContent.includes('within 5 seconds')",
        polling=50,
        timeout=8_000,
    )
    elapsed = time.monotonic() - started
    assert pending, "the page never sent the question"
    assert elapsed >= 4.5, f"gave up after {elapsed:.2f} s, before the 5 s allowed"
    assert elapsed <= 8, f"gave up only after {elapsed:.2f} s"

    expect(status).to_have_text("The server did not answer within 5 seconds.")
    expect(status).to_have_class("error")
    expect(page.locator("#retry")).to_be_visible()
    expect(page.locator("#stop")).to_be_hidden()
    expect(answer.locator(".note")).to_have_text("No answer was produced.")

    # Once the server is reachable again, Retry asks the same question.
    page.unroute_all(behavior="ignoreErrors")
    page.locator("#retry").click()
    retried = page.locator(ANSWERS).nth(1)
    wait_finished(retried)
    expect(retried.locator(".body")).to_have_text("".join(default_tokens(4)))
    expect(page.locator(QUESTIONS).nth(1)).to_have_text("[scripted tokens=4] Is anyone there?")
    expect(page.locator("#retry")).to_be_hidden()
    expect(status).to_have_text("")


def test_model_output_cannot_run_script(open_chat: Callable[..., Page]) -> None:
    """Markup from the model is sanitised: nothing it sends runs, live or from history.

    The page's Content-Security-Policy would block inline handlers on its own, so this test
    turns it off in the browser to check that the sanitiser alone stops them.
    """
    page = open_chat(bypass_csp=True)
    # JSON inside the directive: the engine decodes each \" to a plain quote.
    payload = (
        r"<img src=x onerror=\"window.__pwned=1\">"
        r" <script>window.__pwned=2</script>"
        r" <a href=\"javascript:window.__pwned=3\">click</a>"
        r" <svg onload=\"window.__pwned=4\"></svg>"
        r" <b>bold</b>"
    )
    question = f"[scripted itl_ms=1 text='\"{payload}\"'] Describe a picture."
    images_settled = (
        "(el) => [...el.querySelectorAll('img')].every((img) => img.complete)"
        " && document.readyState === 'complete'"
    )

    answer = ask(page, question)
    wait_finished(answer)
    # Raw HTML keeps its words only: markdown makes no <b>, and no image is ever loaded.
    expect(answer.locator(".body")).to_contain_text("bold")
    expect(answer.locator(".body b")).to_have_count(0)
    expect(answer.locator(".body img")).to_have_count(0)
    page.wait_for_function(images_settled, arg=answer.element_handle())
    assert page.evaluate("() => typeof window.__pwned") == "undefined"
    assert answer.evaluate(UNSAFE_IN_BUBBLE) == []
    # The question is shown as the text it is.
    expect(page.locator(QUESTIONS).last).to_have_text(question)

    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.locator("#conversations button.open").first.click()
    stored = page.locator(ANSWERS).first
    expect(stored.locator(".body")).to_contain_text("bold")
    page.wait_for_function(images_settled, arg=stored.element_handle())
    assert page.evaluate("() => typeof window.__pwned") == "undefined"
    assert stored.evaluate(UNSAFE_IN_BUBBLE) == []
    expect(page.locator(QUESTIONS).first).to_have_text(question)


def test_a_forgotten_session_is_renewed_and_the_question_asked_again(page: Page) -> None:
    """The stream says ``session_required``: the page gets a new session and asks again by
    itself, and the student sees one question and its answer, nothing of the detour."""
    old = next(c for c in page.context.cookies() if c["name"] == "sessionid")
    forged = "forgotten" + "0" * 23
    page.context.add_cookies([{**old, "value": forged}])  # type: ignore[list-item]
    answer = ask(page, "[scripted tokens=3] Still there?")
    wait_finished(answer)
    expect(answer.locator(".body")).to_have_text("".join(default_tokens(3)))
    expect(page.locator(QUESTIONS)).to_have_count(1)
    expect(page.locator("#status")).to_have_text("")
    new = next(c for c in page.context.cookies() if c["name"] == "sessionid")["value"]
    assert new not in (old["value"], forged)


def test_conversation_is_kept_in_the_sidebar(page: Page) -> None:
    """An answered question appears in the sidebar and can be reopened after a reload."""
    question = f"[scripted tokens=8] Why do leaves fall? {uuid.uuid4().hex[:8]}"
    full = "".join(default_tokens(8))
    wait_finished(ask(page, question))

    entry = page.locator("#conversations li")
    expect(entry).to_have_count(1)
    expect(entry.locator("button.open")).to_have_text(question)
    expect(entry).to_have_class("active")

    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    expect(page.locator("#messages .message")).to_have_count(0)
    expect(entry.locator("button.open")).to_have_text(question)
    entry.locator("button.open").click()

    expect(page.locator(QUESTIONS)).to_have_text([question])
    expect(page.locator(ANSWERS)).to_have_count(1)
    expect(page.locator(ANSWERS).locator(".body")).to_have_text(full)
    expect(page.locator(ANSWERS).locator(".note")).to_have_count(0)
    expect(entry).to_have_class("active")

    # Asking again continues the reopened conversation rather than starting another.
    wait_finished(ask(page, "[scripted tokens=3] And then?"))
    expect(page.locator(ANSWERS).nth(1).locator(".body")).to_have_text("".join(default_tokens(3)))
    expect(entry).to_have_count(1)
    expect(entry.locator("button.open")).to_have_text(question)


def test_enter_confirming_an_input_method_composition_does_not_send(page: Page) -> None:
    """Enter that ends an IME composition keeps the text; the next Enter sends it."""
    prompt = page.locator("#prompt")
    prompt.focus()
    ime = page.context.new_cdp_session(page)
    ime.send(
        "Input.imeSetComposition", {"text": "こうごうせい", "selectionStart": 6, "selectionEnd": 6}
    )
    prompt.press("Enter")
    ime.send("Input.insertText", {"text": "光合成"})
    # Headless Chromium also types the Enter into the box; a real input method swallows it.
    expect(prompt).to_have_value(re.compile("^光合成"))
    expect(page.locator("#messages .message")).to_have_count(0)

    answer = ask(page, "[scripted tokens=3] 光合成とは?")
    wait_finished(answer)
    expect(page.locator(QUESTIONS)).to_have_text(["[scripted tokens=3] 光合成とは?"])
    expect(answer.locator(".body")).to_have_text("".join(default_tokens(3)))


def test_conversation_that_cannot_be_opened_says_so(page: Page) -> None:
    """A conversation the server no longer returns leaves the chat as it was, with a message."""
    question = "[scripted tokens=3] What is a leaf?"
    wait_finished(ask(page, question))
    # A lost session: the sidebar still lists the conversation, but it is no longer ours.
    page.context.clear_cookies()
    page.locator("#conversations button.open").first.click()

    expect(page.locator("#status")).to_have_text("That conversation could not be opened.")
    expect(page.locator("#status")).to_have_class("error")
    expect(page.locator(QUESTIONS)).to_have_text([question])
    expect(page.locator(ANSWERS).locator(".body")).to_have_text("".join(default_tokens(3)))
