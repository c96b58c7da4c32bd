"""axe-core, Deque's accessibility engine, run inside a page under test.

The engine is the ``axe.min.js`` that the ``axe-playwright-python`` test dependency bundles (read
from the installed package; no Node.js or npm). It is evaluated with ``page.evaluate``: a
Playwright evaluation is not subject to the page's Content-Security-Policy, whereas
``page.add_script_tag(content=...)`` adds an inline script that ``script-src 'self'`` refuses.

Typical use in a page test::

    violations = axe_violations(page)
    assert not violations, format_violations(violations)
"""

from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from playwright.sync_api import Page

# axe-core's impact levels, least to most severe.
IMPACTS = ("minor", "moderate", "serious", "critical")
SERIOUS = ("serious", "critical")

type Violation = dict[str, Any]


@cache
def axe_source() -> str:
    """The text of the bundled ``axe.min.js``."""
    return (
        resources.files("axe_playwright_python").joinpath("axe.min.js").read_text(encoding="utf-8")
    )


def inject_axe(page: Page) -> str:
    """Define ``window.axe`` in the page's current document (once) and return axe-core's version."""
    if not page.evaluate("() => typeof window.axe?.run === 'function'"):
        page.evaluate(axe_source())
    return page.evaluate("() => window.axe.version")


def axe_violations(
    page: Page,
    *,
    impacts: Sequence[str] = SERIOUS,
    context: str | None = None,
    rules: Iterable[str] | None = None,
) -> list[Violation]:
    """Run axe-core on the page and return the violations whose impact is in ``impacts``.

    ``context`` is a CSS selector to check instead of the whole document; ``rules`` limits the
    run to those rule ids (by default every rule axe-core enables by default). Each violation is
    axe-core's own result object: ``id``, ``impact``, ``help``, ``helpUrl``, ``nodes`` (each with
    ``target``, ``html`` and ``failureSummary``) and so on.
    """
    unknown = set(impacts) - set(IMPACTS)
    if unknown:
        raise ValueError(f"unknown axe-core impacts {sorted(unknown)}; known: {IMPACTS}")
    inject_axe(page)
    options: dict[str, Any] = {"resultTypes": ["violations"]}
    if rules is not None:
        options["runOnly"] = {"type": "rule", "values": list(rules)}
    results = page.evaluate(
        "([context, options]) => window.axe.run(context ?? document, options)",
        [context, options],
    )
    return [v for v in results["violations"] if v.get("impact") in impacts]


def _target(target: Any) -> str:
    """One node's selector: a list of selectors (into iframes), each maybe a shadow-DOM path."""
    if isinstance(target, list):
        return " >>> ".join(_target(part) for part in target)
    return str(target)


def format_violations(violations: Iterable[Violation], *, max_targets: int = 3) -> str:
    """A readable summary for an assertion message: one line per rule, then where it failed."""
    lines = []
    for violation in violations:
        nodes = violation.get("nodes", [])
        lines.append(
            f"{violation['id']} ({violation.get('impact')}): {violation.get('help')}"
            f" [{len(nodes)} node{'s' if len(nodes) != 1 else ''}] {violation.get('helpUrl', '')}"
        )
        for node in nodes[:max_targets]:
            lines.append(f"    {_target(node.get('target', []))}")
        if len(nodes) > max_targets:
            lines.append(f"    ... and {len(nodes) - max_targets} more")
    return "\n".join(lines) if lines else "no accessibility violations"
