"""tests/frontend/axe.py finds a known accessibility fault on the real chat page, and stops
reporting it once the fault is fixed. The chat page's own state is not judged here."""

import pytest
from playwright.sync_api import Page

from tests.frontend.axe import IMPACTS, axe_violations, format_violations

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A button whose only content is an image with no text alternative: it has no accessible name.
ADD_PROBE = """() => {
    const button = document.createElement('button');
    button.type = 'button';
    button.id = 'axe-probe';
    button.append(document.createElement('img'));
    document.body.append(button);
}"""


def probe_violations(page: Page, rule: str, **kwargs) -> list[dict]:
    return [
        violation
        for violation in axe_violations(page, **kwargs)
        if violation["id"] == rule
        and any(node["target"] == ["#axe-probe"] for node in violation["nodes"])
    ]


def test_axe_reports_a_button_without_a_name(page: Page) -> None:
    """Injected in spite of the page's CSP, axe-core names the rule, its impact and the node."""
    page.evaluate(ADD_PROBE)

    found = probe_violations(page, "button-name")
    assert [v["impact"] for v in found] == ["critical"], format_violations(axe_violations(page))
    message = format_violations(found)
    assert message.startswith("button-name (critical): Buttons must have discernible text")
    assert "\n    #axe-probe" in message
    # Filtered by impact: a critical fault is not among the minor ones.
    assert not probe_violations(page, "button-name", impacts=("minor",))


def test_axe_does_not_report_the_fixed_button(page: Page) -> None:
    """The same button once its image has a text alternative: no violation for it any more."""
    page.evaluate(ADD_PROBE)
    assert probe_violations(page, "button-name", rules=["button-name"])

    page.locator("#axe-probe img").evaluate("(img) => { img.alt = 'Send'; }")
    assert not probe_violations(page, "button-name")
    assert not probe_violations(page, "image-alt", impacts=IMPACTS)
