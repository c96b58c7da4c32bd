"""What a student does with answers and conversations, in headless Chromium against a real
Daphne: code highlighted and copied, maths set, an answer copied or asked for again, a question
edited and sent again, conversations renamed and deleted."""

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from assistant.models import Conversation, Message
from tests.frontend.test_chat_page import ANSWERS, QUESTIONS, ask, wait_finished
from tests.support import from_db, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CODE = "import math\nprint(math.pi)"
RICH = json.dumps(
    [
        "Here is the code:\n\n",
        "```python\n",
        CODE + "\n",
        "```\n\n",
        "A fraction $\\frac{a}{b}$ and $5 or $10 stay money.\n\n",
        "$$x^2 + y^2 = r^2$$\n",
    ]
)


@pytest.fixture
def clipboard_page(open_chat: Callable[..., Page]) -> Page:
    return open_chat(permissions=["clipboard-read", "clipboard-write"])


def clipboard(page: Page) -> str:
    return page.evaluate("() => navigator.clipboard.readText()")


def test_code_is_highlighted_and_copied_and_maths_is_set(clipboard_page: Page) -> None:
    """A Python block is highlighted with a Copy code button that copies exactly the code; TeX
    between $…$ and $$…$$ becomes MathML, money does not; Copy copies the answer as written."""
    page = clipboard_page
    answer = ask(page, f"[scripted ttft_ms=0 itl_ms=200 text='{RICH}'] Show me.")
    # The code block is on screen, with its button, while the answer is still coming in.
    page.wait_for_function(
        "(el) => el.classList.contains('streaming') && el.querySelector('pre code')"
        " && el.querySelector('.code-bar button')",
        arg=answer.element_handle(),
    )
    wait_finished(answer)
    body = answer.locator(".body")
    expect(body.locator("pre code.hljs .hljs-keyword").first).to_have_text("import")
    expect(body.locator("tex-inline math")).to_have_count(1)
    expect(body.locator("tex-block math[display='block']")).to_have_count(1)
    expect(body).to_contain_text("$5 or $10 stay money.")
    answer.locator(".code-bar button").click()
    expect(answer.locator(".code-bar button")).to_have_text("Copied")
    assert clipboard(page) == CODE + "\n"
    answer.locator(".actions button", has_text="Copy").click()
    assert clipboard(page) == "".join(json.loads(RICH))


def test_asking_again_replaces_the_last_answer(page: Page) -> None:
    """Ask again on the last answer streams a new one in its place; the conversation, reopened,
    shows two exchanges, and the replaced answer is kept on the server, set aside."""
    wait_finished(ask(page, "[scripted tokens=2] first"))
    wait_finished(ask(page, "[scripted tokens=3] second"))
    expect(
        page.locator(ANSWERS).first.locator(".actions button", has_text="Ask again")
    ).to_have_count(0)
    page.locator(ANSWERS).last.locator(".actions button", has_text="Ask again").click()
    expect(page.locator(ANSWERS)).to_have_count(2)
    wait_finished(page.locator(ANSWERS).last)
    expect(page.locator(QUESTIONS)).to_have_text(
        ["[scripted tokens=2] first", "[scripted tokens=3] second"]
    )
    replaced = Message.objects.filter(replaced_at__isnull=False)
    wait_for(lambda: from_db(replaced.count) == 2)
    assert from_db(Message.objects.filter(replaced_at__isnull=True).count) == 4
    assert from_db(Conversation.objects.count) == 1

    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.locator("#conversations button.open").first.click()
    expect(page.locator(QUESTIONS)).to_have_count(2)
    expect(page.locator(ANSWERS)).to_have_count(2)


def test_an_edited_question_is_sent_again_in_place(page: Page) -> None:
    """Edit turns a question into a box; Esc cancels; sending the edited text replaces it and
    everything after it, here and after a reload."""
    wait_finished(ask(page, "[scripted tokens=2] what is a cel"))
    wait_finished(ask(page, "[scripted tokens=2] and a tissue?"))
    first = page.locator("#messages .message.user").first
    first.locator(".actions button", has_text="Edit").click()
    box = first.locator(".editor textarea")
    expect(box).to_be_focused()
    expect(box).to_have_value("[scripted tokens=2] what is a cel")
    box.press("Escape")
    expect(first.locator(".editor")).to_have_count(0)
    expect(page.locator(QUESTIONS)).to_have_count(2)

    first.locator(".actions button", has_text="Edit").click()
    first.locator(".editor textarea").fill("[scripted tokens=4] what is a cell?")
    first.locator(".editor button", has_text="Send").click()
    expect(page.locator(QUESTIONS)).to_have_text(["[scripted tokens=4] what is a cell?"])
    wait_finished(page.locator(ANSWERS).last)
    expect(page.locator(ANSWERS)).to_have_count(1)
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.locator("#conversations button.open").first.click()
    expect(page.locator(QUESTIONS)).to_have_text(["[scripted tokens=4] what is a cell?"])


def test_conversations_are_renamed_and_deleted_from_the_sidebar(page: Page) -> None:
    """✎ renames a conversation in place (kept after a reload); ✕ asks first, then deletes it
    and clears the chat it was open in."""
    wait_finished(ask(page, "[scripted tokens=2] photosynthesis"))
    entry = page.locator("#conversations li").first
    entry.locator("button.rename-button").click()
    name = page.locator("#conversations input.rename")
    expect(name).to_be_focused()
    name.fill("Biology, lesson 3")
    name.press("Enter")
    expect(page.locator("#conversations button.open")).to_have_text(["Biology, lesson 3"])
    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    expect(page.locator("#conversations button.open")).to_have_text(["Biology, lesson 3"])

    page.locator("#conversations button.open").first.click()
    expect(page.locator(ANSWERS)).to_have_count(1)
    dialogs: list[str] = []

    def answer_dialog(dialog) -> None:  # type: ignore[no-untyped-def]
        dialogs.append(dialog.message)
        if len(dialogs) == 1:
            dialog.dismiss()
        else:
            dialog.accept()

    page.on("dialog", answer_dialog)
    page.locator("#conversations li button.delete-button").first.click()
    expect(page.locator("#conversations li")).to_have_count(1)  # dismissed: kept
    page.locator("#conversations li button.delete-button").first.click()
    expect(page.locator("#conversations li")).to_have_count(0)
    expect(page.locator(ANSWERS)).to_have_count(0)
    assert dialogs[0] == "Delete “Biology, lesson 3”? This cannot be undone."
    assert not from_db(Conversation.objects.exists)


def test_a_chinese_phone_asks_again_edits_renames_and_deletes(
    open_chat: Callable[..., Page], output_dir: Path
) -> None:
    """At 390 × 844 in zh-CN, the whole round: the buttons are in Chinese, Ask again and Edit
    replace what they should, and the drawer's ✎ and ✕ rename and delete the conversation."""
    page = open_chat(locale="zh-CN", viewport={"width": 390, "height": 844})
    answer = ask(page, "[scripted tokens=2] 你好")
    wait_finished(answer)
    expect(answer.locator(".actions button")).to_have_text(["复制", "重新回答"])
    answer.locator(".actions button", has_text="重新回答").click()
    wait_finished(page.locator(ANSWERS).last)
    expect(page.locator(ANSWERS)).to_have_count(1)

    question = page.locator("#messages .message.user").first
    question.locator(".actions button", has_text="编辑").click()
    question.locator(".editor textarea").fill("[scripted tokens=3] 光合作用是什么？")
    question.locator(".editor button", has_text="发送").click()
    expect(page.locator(QUESTIONS)).to_have_text(["[scripted tokens=3] 光合作用是什么？"])
    wait_finished(page.locator(ANSWERS).last)
    page.screenshot(path=output_dir / "chat-zh-CN-390x844-actions.png")

    page.locator("#menu").click()
    entry = page.locator("#conversations li").first
    expect(entry.locator("button.rename-button")).to_have_attribute(
        "aria-label", re.compile("^重命名")
    )
    entry.locator("button.rename-button").click()
    page.locator("#conversations input.rename").fill("生物第三课")
    page.locator("#conversations input.rename").press("Enter")
    expect(page.locator("#conversations button.open")).to_have_text(["生物第三课"])
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#conversations li button.delete-button").first.click()
    expect(page.locator("#conversations li")).to_have_count(0)
    expect(page.locator(ANSWERS)).to_have_count(0)
    assert not from_db(Conversation.objects.exists)


def test_an_edit_the_server_refuses_leaves_the_conversation_as_it_was(page: Page) -> None:
    """Two tabs of one session show the same conversation; the first edits a question, then the
    second edits the same (now replaced) question: the server refuses it (409), and the second
    tab shows its conversation as it was, with the server's reason, instead of an empty page."""
    wait_finished(ask(page, "[scripted tokens=2] original question"))
    other = page.context.new_page()
    other.goto("/")
    other.wait_for_selector("body[data-ready='1']", state="attached")
    other.locator("#conversations button.open").first.click()
    expect(other.locator(QUESTIONS)).to_have_text(["[scripted tokens=2] original question"])

    first = page.locator("#messages .message.user").first
    first.locator(".actions button", has_text="Edit").click()
    first.locator(".editor textarea").fill("[scripted tokens=2] edited here")
    first.locator(".editor button", has_text="Send").click()
    wait_finished(page.locator(ANSWERS).last)

    stale = other.locator("#messages .message.user").first
    stale.locator(".actions button", has_text="Edit").click()
    stale.locator(".editor textarea").fill("[scripted tokens=2] edited there")
    stale.locator(".editor button", has_text="Send").click()
    expect(other.locator("#status")).to_have_text(re.compile("edited or asked again already"))
    expect(other.locator(QUESTIONS)).to_have_text(["[scripted tokens=2] original question"])
    expect(other.locator(ANSWERS)).to_have_count(1)
    expect(other.locator("#retry")).to_be_visible()
