"""Simplified Chinese and English: the page and the API's error messages speak the language the
student chose on the page, else their browser's; error codes never change with the language;
every string has its translation, and the catalogues compile without GNU gettext."""

import gettext
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import polib
import pytest
from django.test import Client, override_settings

from assistant.catalogues import compile_catalogues
from assistant.i18n import scope_language
from tests.support import ChatClient, LiveServer

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"
ZH_BROWSER = "zh-CN,zh;q=0.9,en;q=0.8"

pytestmark = pytest.mark.django_db(transaction=True)


def page_language(client: Client, **headers: str) -> str:
    response = client.get("/", headers=headers)
    assert response.status_code == 200
    return response.wsgi_request.LANGUAGE_CODE  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("accept", "cookie"),
    [
        (ZH_BROWSER, None),
        ("zh-cn", None),
        ("zh-TW,zh;q=0.8", None),
        ("zh", None),
        ("en-US,en;q=0.9", None),
        ("fr-FR,fr;q=0.9", None),
        ("fr;q=0.9,zh-CN;q=0.5", None),
        ("", None),
        ("en-US", "zh-hans"),
        (ZH_BROWSER, "en"),
        (ZH_BROWSER, "xx-not-a-language"),
    ],
)
def test_stream_language_is_the_one_the_pages_pick(accept: str, cookie: str | None) -> None:
    """The chat stream (which runs without Django's middleware) picks the language that
    LocaleMiddleware picks for a page with the same cookie and Accept-Language."""
    client = Client()
    headers = {"accept-language": accept} if accept else {}
    if cookie is not None:
        client.cookies["django_language"] = cookie
    expected = page_language(client, **headers)
    scope_headers = [(b"accept-language", accept.encode())] if accept else []
    if cookie is not None:
        scope_headers.append((b"cookie", f"csrftoken=x; django_language={cookie}".encode()))
    assert scope_language({"headers": scope_headers}) == expected


def test_the_stream_language_follows_a_changed_setting(settings: Any) -> None:
    """The language picked for a cookie and an Accept-Language is remembered, and forgotten
    when the site's languages change."""
    scope_headers = [(b"accept-language", ZH_BROWSER.encode())]
    assert scope_language({"headers": list(scope_headers)}) == "zh-hans"
    settings.LANGUAGES = [("en", "English")]
    assert scope_language({"headers": list(scope_headers)}) == "en"


def test_a_chinese_browser_gets_the_chinese_page() -> None:
    """zh-CN gets <html lang="zh-Hans"> and Chinese strings; en-US gets English."""
    zh = Client().get("/", headers={"accept-language": ZH_BROWSER}).content.decode()
    assert '<html lang="zh-Hans">' in zh
    assert ">发送</button>" in zh
    assert "输入问题，按回车发送" in zh
    # The scripts' strings travel in the page, translated.
    strings = json.loads(re.search(r'id="page-strings"[^>]*>(.*?)</script>', zh, re.S)[1])
    assert strings["waitingFirstWord"] == "正在等待第一个字……"
    en = Client().get("/", headers={"accept-language": "en-US"}).content.decode()
    assert '<html lang="en">' in en
    assert ">Send</button>" in en


def test_the_language_switcher_remembers_the_choice() -> None:
    """Choosing 中文 on the page (a POST with the CSRF token) keeps the page in Chinese for an
    English browser, until the student chooses again."""
    client = Client(enforce_csrf_checks=True)
    client.get("/", headers={"accept-language": "en-US"})
    token = client.cookies["csrftoken"].value
    refused = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/"})
    assert refused.status_code == 403  # no CSRF token
    chosen = client.post(
        "/i18n/setlang/",
        {"language": "zh-hans", "next": "/", "csrfmiddlewaretoken": token},
    )
    assert chosen.status_code == 302 and chosen.headers["location"] == "/"
    assert page_language(client, **{"accept-language": "en-US"}) == "zh-hans"
    client.post("/i18n/setlang/", {"language": "en", "next": "/", "csrfmiddlewaretoken": token})
    assert page_language(client, **{"accept-language": ZH_BROWSER}) == "en"


@pytest.mark.parametrize("serving_path", ["direct", "django"])
def test_api_errors_are_in_the_page_language_with_the_same_code(
    daphne: LiveServer, serving_path: str
) -> None:
    """The same bad request gets the same status and code in both languages, and its message in
    the language of the request (Accept-Language, or the cookie the switcher sets)."""
    client = ChatClient(daphne)
    try:
        url = f"/api/chat/stream/{serving_path}"
        answers = {}
        for language in ("en-US", ZH_BROWSER):
            response = client.raw(b"{not json", {"Accept-Language": language}, path=url)
            payload = json.loads(response.body())
            answers[language] = (
                response.status,
                payload["error"]["code"],
                payload["error"]["message"],
            )
        assert answers["en-US"] == (400, "invalid_json", "The request body is not valid JSON.")
        assert answers[ZH_BROWSER] == (400, "invalid_json", "请求正文不是有效的 JSON。")

        too_long = {"message": "长" * 4001}
        response = client.raw(too_long, {"Accept-Language": ZH_BROWSER}, path=url)
        assert json.loads(response.body())["error"] == {
            "code": "message_too_long",
            "message": "问题超过了 4000 个字符。",
        }
        # The switcher's cookie wins over the browser's language.
        client.client.cookies.set("django_language", "zh-hans")
        response = client.raw(b"[]", {"Accept-Language": "en-US"}, path=url)
        error = json.loads(response.body())["error"]
        assert error["code"] == "invalid_body"
        assert error["message"].startswith("请发送一个 JSON 对象")
    finally:
        client.close()


@pytest.mark.parametrize("serving_path", ["direct", "django"])
def test_an_error_event_mid_answer_is_in_the_askers_language(
    daphne: LiveServer, serving_path: str
) -> None:
    """A model failing after two tokens ends the stream with an ``error`` event in Chinese for a
    Chinese browser; the tokens before it arrive as they were."""
    client = ChatClient(daphne)
    try:
        client.client.headers["Accept-Language"] = ZH_BROWSER
        events = client.ask(
            "[scripted tokens=5 fail_after=2] 你好", url=f"/api/chat/stream/{serving_path}"
        )
        tokens = [e for e in events if e.event == "token"]
        assert len(tokens) == 2
        error = json.loads(events[-1].data)
        assert events[-1].event == "error"
        assert error["message"] == "模型意外停止了，请再试一次。"
    finally:
        client.close()


def test_the_page_says_when_the_model_does_not_speak_the_students_language() -> None:
    """The default model answers in English: a Chinese page says so before the student asks; an
    English page does not, and neither does a Chinese page when the engine declares zh."""
    zh = Client().get("/", headers={"accept-language": ZH_BROWSER}).content.decode()
    assert 'id="model-language"' in zh and "只会用英语回答" in zh
    en = Client().get("/", headers={"accept-language": "en-US"}).content.decode()
    assert 'id="model-language"' not in en
    from django.conf import settings

    engines = {
        alias: {**config, "OPTIONS": {**config["OPTIONS"], "LANGUAGES": ["en", "zh"]}}
        for alias, config in settings.CHATSITE_ENGINES.items()
    }
    with override_settings(CHATSITE_ENGINES=engines):
        zh = Client().get("/", headers={"accept-language": ZH_BROWSER}).content.decode()
    assert 'id="model-language"' not in zh


def _placeholders(text: str) -> set[str]:
    return set(re.findall(r"\{\w+\}|%\(\w+\)[sd]", text))


def test_every_string_has_its_chinese_translation() -> None:
    """Every msgid in the catalogue is translated (not fuzzy, not empty) with the same
    placeholders, and the catalogue holds every string the code and templates mark: running
    makemessages on a copy of the sources finds nothing the catalogue lacks."""
    catalogue = polib.pofile(str(CATALOGUE))
    missing = [e.msgid for e in catalogue if not e.translated() or "fuzzy" in e.flags]
    assert not missing, f"untranslated: {missing}"
    for entry in catalogue:
        translations = list(entry.msgstr_plural.values()) if entry.msgid_plural else [entry.msgstr]
        for msgstr in translations:
            assert _placeholders(entry.msgid) == _placeholders(msgstr), entry.msgid

    assert shutil.which("xgettext"), "GNU gettext is needed (scripts/setup --test installs it)"
    ours = {e.msgid for e in catalogue if not e.obsolete}
    extracted = _extract(ROOT)
    assert extracted - ours == set(), "strings not in locale/zh_Hans (run makemessages)"
    assert ours - extracted == set(), "strings in the catalogue that nothing uses"


def _extract(root: Path) -> set[str]:
    """The msgids makemessages finds in ``root``'s sources (on a copy: the repository's own
    catalogue is left as it is)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in ["assistant", "chatsite", "frontend", "manage.py"]:
            source = root / name
            if source.is_dir():
                shutil.copytree(
                    source, work / name, ignore=shutil.ignore_patterns("__pycache__", "static")
                )
            else:
                shutil.copy(source, work / name)
        (work / "locale").mkdir()
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "makemessages",
                "-l",
                "zh_Hans",
                "--no-location",
                "-v",
                "0",
            ],
            cwd=work,
            check=True,
            env={**__import__("os").environ, "CHATSITE_PRELOAD_ENGINE": "0"},
        )
        extracted = polib.pofile(str(work / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po"))
        return {e.msgid for e in extracted}


def test_catalogues_compile_without_gnu_gettext(tmp_path: Path) -> None:
    """``python -m assistant.catalogues`` (what scripts/setup runs) writes a .mo that gettext
    reads, leaves fuzzy entries out, and compiles again only a changed .po."""
    messages = tmp_path / "zh_Hans" / "LC_MESSAGES"
    messages.mkdir(parents=True)
    po = polib.POFile()
    po.metadata = {
        "Content-Type": "text/plain; charset=UTF-8",
        "Plural-Forms": "nplurals=1; plural=0;",
    }
    po.append(polib.POEntry(msgid="Send", msgstr="发送"))
    po.append(polib.POEntry(msgid="Stop", msgstr="停", flags=["fuzzy"]))
    po.save(str(messages / "django.po"))

    assert compile_catalogues([tmp_path]) == [messages / "django.mo"]
    with open(messages / "django.mo", "rb") as mo:
        translations = gettext.GNUTranslations(mo)
    assert translations.gettext("Send") == "发送"
    assert translations.gettext("Stop") == "Stop"
    assert compile_catalogues([tmp_path]) == []  # unchanged: not compiled again

    # The repository's own catalogue compiles, and the running site reads it.
    assert (CATALOGUE.with_suffix(".mo")).exists(), "scripts/setup compiles locale/ (run it)"
