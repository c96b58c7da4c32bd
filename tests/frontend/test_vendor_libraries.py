"""The vendored highlight.js and KaTeX: exactly the files meant, each served from /static/, each
module usable from the chat page as it is (its Content-Security-Policy included), and each
VERSION naming the version the code itself reports (headless Chromium)."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VENDOR = Path(__file__).resolve().parents[2] / "frontend" / "static" / "vendor"
HIGHLIGHT = VENDOR / "highlight"
KATEX = VENDOR / "katex"

#: The highlight.js grammars vendored: the languages students ask about.
HIGHLIGHT_LANGUAGES = sorted(
    "bash c cpp csharp css go java javascript json kotlin latex markdown matlab php plaintext"
    " python r ruby rust shell sql swift typescript xml yaml".split()
)
HIGHLIGHT_FILES = {
    "LICENSE",
    "VERSION",
    "es/core.min.js",
    *(f"es/languages/{name}.min.js" for name in HIGHLIGHT_LANGUAGES),
}
#: KaTeX's MathML output only: the browser lays maths out itself, with no stylesheet or fonts.
KATEX_FILES = {"LICENSE", "VERSION", "katex.mjs"}

VERSION_LINE = re.compile(r"^(?P<name>.+?) (?P<version>\d+\.\d+\.\d+) \(npm: (?P<package>[^)]+)\)")

TYPES = {".js": "javascript", ".mjs": "javascript", ".css": "text/css", ".woff2": "font/woff2"}


def files_in(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()}


def version_file(directory: Path) -> dict[str, str]:
    """The name, version and npm package the VERSION file's first line names, with the tarball
    and integrity lines it records."""
    text = (directory / "VERSION").read_text()
    match = VERSION_LINE.match(text)
    assert match, text
    fields = match.groupdict()
    fields["tarball"] = re.search(r"^Tarball: (\S+)$", text, re.M)[1]
    fields["integrity"] = re.search(r"^Integrity: (\S+)$", text, re.M)[1]
    return fields


def test_only_the_files_meant_are_vendored() -> None:
    assert files_in(HIGHLIGHT) == HIGHLIGHT_FILES
    assert files_in(KATEX) == KATEX_FILES


@pytest.mark.parametrize(
    ("directory", "name", "package"),
    [(HIGHLIGHT, "highlight.js", "@highlightjs/cdn-assets"), (KATEX, "KaTeX", "katex")],
)
def test_version_files_name_the_package_and_its_tarball(
    directory: Path, name: str, package: str
) -> None:
    fields = version_file(directory)
    assert (fields["name"], fields["package"]) == (name, package)
    tarball_name = package.rsplit("/", 1)[-1]
    assert fields["tarball"] == (
        f"https://registry.npmjs.org/{package}/-/{tarball_name}-{fields['version']}.tgz"
    )
    assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", fields["integrity"])


def test_vendored_files_are_served_as_they_are(page: Page) -> None:
    for directory, names in ((HIGHLIGHT, HIGHLIGHT_FILES), (KATEX, KATEX_FILES)):
        for name in sorted(names):
            url = f"/static/vendor/{directory.name}/{name}"
            response = page.request.get(url)
            assert response.status == 200, url
            assert response.body() == (directory / name).read_bytes(), url
            expected_type = TYPES.get(Path(name).suffix)
            if expected_type:
                assert expected_type in response.headers["content-type"], url


def test_highlight_js_highlights_every_vendored_language(page: Page) -> None:
    result = page.evaluate(
        """async (languages) => {
            const hljs = (await import('/static/vendor/highlight/es/core.min.js')).default;
            for (const name of languages) {
                const url = `/static/vendor/highlight/es/languages/${name}.min.js`;
                const grammar = await import(url);
                hljs.registerLanguage(name, grammar.default);
            }
            const python = hljs.highlight('def area(r):\\n    return 3.14 * r ** 2', {
                language: 'python',
            }).value;
            const others = languages.map((language) => hljs.highlight('x = 1', { language }));
            return {
                version: hljs.versionString,
                registered: hljs.listLanguages().sort(),
                html: Boolean(hljs.getLanguage('html')),
                python,
                others: others.length,
            };
        }""",
        HIGHLIGHT_LANGUAGES,
    )
    assert result["version"] == version_file(HIGHLIGHT)["version"]
    assert result["registered"] == HIGHLIGHT_LANGUAGES
    assert result["html"], "xml's grammar answers for html"
    assert '<span class="hljs-keyword">def</span>' in result["python"]
    assert '<span class="hljs-keyword">return</span>' in result["python"]
    assert result["others"] == len(HIGHLIGHT_LANGUAGES)


def test_highlight_js_files_are_all_the_vendored_version() -> None:
    version = version_file(HIGHLIGHT)["version"]
    assert f"Highlight.js v{version} " in (HIGHLIGHT / "es" / "core.min.js").read_text()
    for name in HIGHLIGHT_LANGUAGES:
        grammar = (HIGHLIGHT / "es" / "languages" / f"{name}.min.js").read_text()
        assert f"compiled for Highlight.js {version} " in grammar, name


def test_katex_renders_to_a_string(page: Page) -> None:
    result = page.evaluate(
        """async () => {
            const katex = (await import('/static/vendor/katex/katex.mjs')).default;
            return { version: katex.version, markup: katex.renderToString('\\\\frac{a}{b}') };
        }"""
    )
    assert result["version"] == version_file(KATEX)["version"]
    assert result["markup"].startswith('<span class="katex">')
    assert 'class="mfrac"' in result["markup"]
    assert '<annotation encoding="application/x-tex">\\frac{a}{b}</annotation>' in result["markup"]


def test_katex_mathml_renders_under_the_pages_policy(page: Page) -> None:
    """KaTeX's MathML output (what the page uses) carries no inline style, so it can be put into
    the page under its Content-Security-Policy without a single violation, and the browser lays
    the fraction out itself: numerator above denominator."""
    result = page.evaluate(
        """async () => {
            const violations = [];
            document.addEventListener('securitypolicyviolation', (e) => violations.push(
                `${e.violatedDirective}: ${e.blockedURI || e.sample}`));
            const katex = (await import('/static/vendor/katex/katex.mjs')).default;
            const el = document.createElement('div');
            el.innerHTML = katex.renderToString('\\\\frac{a}{b} + \\\\vec{v}', {
                output: 'mathml', displayMode: true });
            document.body.append(el);
            await new Promise((resolve) => setTimeout(resolve, 50));
            const mi = [...el.querySelectorAll('mfrac > mi')].map((m) => m.getBoundingClientRect());
            return { violations, styled: el.querySelectorAll('[style]').length,
                     math: el.querySelectorAll('math').length, above: mi[0].bottom <= mi[1].top };
        }"""
    )
    assert result == {"violations": [], "styled": 0, "math": 1, "above": True}
