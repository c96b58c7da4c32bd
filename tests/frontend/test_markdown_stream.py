"""An answer rendered as it streams (``markdown.js``: finished blocks kept, the block being
written rendered again) ends up exactly as the whole answer rendered at once, for the markdown
that most often splits wrongly: loose lists, code with blank lines, inline backticks that look
like a fence, indented code, tables, setext headings, maths, quotes. Run in headless Chromium
on the real module, fed one character at a time."""

import pytest
from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCUMENTS = [
    "Para one.\n\nPara two with **bold**.\n",
    "Steps:\n1. first\n\n2. second\n\nAfter the list.\n",
    "- x\n- y\n\n- z\n\nText after.\n",
    "```python\nx = 1\n\ny = 2\n```\n\nAfter the code.\n",
    "```x``` is inline code, not a fence.\n\n```\ncode a\n\ncode b\n```\n\nEnd.\n",
    "    indented code\n\n    more of it\n\nText.\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n\nAfter the table.\n",
    "Title\n=====\n\nBody under it.\n",
    "A $x^2$ formula.\n\n$$\\frac{a}{b}$$\n\nEnd, $5 and $10.\n",
    "> a quote\n> goes on\n\nplain words\n",
    "1. one\n   continued\n\n   still item one\n2. two\n\n# Heading\n\nlast\n",
]

# Both renderings, once highlighting and maths (asynchronous) have settled, as a tree of tags
# and text with the live one's wrapper around the block being written taken away and the
# whitespace between blocks ignored.
COMPARE = """async (documents) => {
    const m = await import('/static/chatsite/markdown.js');
    const shape = (node) => {
        if (node.nodeType === Node.TEXT_NODE) {
            return node.data.trim() ? node.data.replace(/\\s+$/, '') : null;
        }
        const children = [...node.childNodes].map(shape).filter((c) => c !== null).flat();
        if (node.classList && node.classList.contains('md-tail')) return children;
        const attrs = [...node.attributes].filter((a) => a.name !== 'data-set')
            .map((a) => `${a.name}=${a.value}`).sort();
        return [[node.tagName, attrs, children]];
    };
    const settle = () => new Promise((resolve) => setTimeout(resolve, 300));
    const results = [];
    for (const text of documents) {
        const live = document.createElement('div');
        const whole = document.createElement('div');
        document.body.append(live, whole);
        const stream = new m.LiveMarkdown(live);
        for (const c of text) stream.append(c);
        m.showMarkdown(whole, text);
        await settle();
        results.push([text, JSON.stringify(shape(live)), JSON.stringify(shape(whole))]);
        live.remove();
        whole.remove();
    }
    return results;
}"""


def test_streamed_rendering_ends_as_the_whole_answer_rendered(page: Page) -> None:
    """Fed a character at a time, without the final re-render, each document is the same tree
    of elements, attributes and text as the document rendered whole."""
    mismatched = [
        (text, live, whole)
        for text, live, whole in page.evaluate(COMPARE, DOCUMENTS)
        if live != whole
    ]
    assert not mismatched, mismatched
