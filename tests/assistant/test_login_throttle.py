"""Password logins are throttled per account and per address, over real HTTP on a real Daphne:
a guesser is locked out with a clear message and a 429, the right password included, while
other accounts and other addresses log in as usual."""

import re

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import translation

from assistant.forms import locked_message
from assistant.services.logins import login_failed, login_locked, login_succeeded
from tests.support import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "pw-long-enough-123"


@pytest.fixture(scope="module")
def guarded(daphne_factory) -> LiveServer:
    """Three failures per account, six per address, locked for ten minutes."""
    return daphne_factory(
        CHATSITE_LOGIN_FAILURES_PER_ACCOUNT="3",
        CHATSITE_LOGIN_FAILURES_PER_ADDRESS="6",
        CHATSITE_LOGIN_LOCKOUT_S="600",
    )


class Login:
    """A browser on the admin's login page, from the loopback address ``source``."""

    def __init__(self, server: LiveServer, source: str) -> None:
        transport = httpx.HTTPTransport(local_address=source)
        self.client = httpx.Client(base_url=server.url, timeout=30, transport=transport)

    def attempt(self, username: str, password: str) -> httpx.Response:
        page = self.client.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None, page.text
        return self.client.post(
            "/admin/login/?next=/dashboard/",
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": token.group(1),
                "next": "/dashboard/",
            },
        )

    def close(self) -> None:
        self.client.close()


def logged_in(response: httpx.Response) -> bool:
    return response.status_code == 302 and response.headers["location"] == "/dashboard/"


@pytest.fixture
def staff() -> list[str]:
    names = ["ada", "grace"]
    for name in names:
        get_user_model().objects.create_user(name, password=PASSWORD, is_staff=True)
    return names


def test_wrong_passwords_lock_the_account_with_a_clear_429(guarded: LiveServer, staff) -> None:
    guesser, colleague = Login(guarded, "127.0.0.21"), Login(guarded, "127.0.0.22")
    try:
        tries = [guesser.attempt("ada", f"guess-{n}") for n in range(3)]
        assert [r.status_code for r in tries] == [200, 200, 200]  # the form, with its error
        locked = guesser.attempt("ada", PASSWORD)
        # From another address too: the account is locked, not only the guesser.
        elsewhere = colleague.attempt("ADA", PASSWORD)
        other_account = colleague.attempt("grace", PASSWORD)
    finally:
        guesser.close()
        colleague.close()
    for response in (locked, elsewhere):
        assert response.status_code == 429
        assert 540 <= int(response.headers["retry-after"]) <= 600
        assert "Too many failed logins" in response.text
        assert "try again in 10 minutes" in response.text
    assert logged_in(other_account)


def test_many_accounts_tried_from_one_address_lock_that_address(guarded: LiveServer, staff) -> None:
    guesser, teacher = Login(guarded, "127.0.0.23"), Login(guarded, "127.0.0.24")
    try:
        statuses = [guesser.attempt(f"user-{n}", "guess").status_code for n in range(6)]
        refused = guesser.attempt("grace", PASSWORD)
        elsewhere = teacher.attempt("grace", PASSWORD)
    finally:
        guesser.close()
        teacher.close()
    assert statuses == [200] * 6
    assert refused.status_code == 429 and "Too many failed logins" in refused.text
    assert logged_in(elsewhere)


def test_a_success_forgives_the_account_failures_before_it(guarded: LiveServer, staff) -> None:
    login = Login(guarded, "127.0.0.25")
    try:
        first = [login.attempt("grace", "typo").status_code for _ in range(2)]
        assert logged_in(login.attempt("grace", PASSWORD))
        login.client.cookies.clear()
        again = [login.attempt("grace", "typo").status_code for _ in range(2)]
        still = login.attempt("grace", PASSWORD)
    finally:
        login.close()
    assert first == again == [200, 200]
    assert logged_in(still)


def test_a_lockout_ends_after_its_window(settings) -> None:
    settings.CHATSITE_LOGIN_LIMITS = {
        "FAILURES_PER_ACCOUNT": 2,
        "FAILURES_PER_ADDRESS": 100,
        "LOCKOUT_S": 60,
    }
    start = 1_000_000.0
    for offset in (0, 1):
        login_failed(username="lin", client="192.0.2.9", now=start + offset)
    assert login_locked(username="lin", client="192.0.2.9", now=start + 2) == 59
    assert login_locked(username="Lin ", client="198.51.100.1", now=start + 2) == 59
    assert login_locked(username="mei", client="192.0.2.9", now=start + 2) is None
    assert login_locked(username="lin", client="192.0.2.9", now=start + 61) is None
    login_succeeded(username="lin")  # clears counts, not a lockout in force
    assert login_locked(username="lin", client="192.0.2.9", now=start + 30) == 31


ZH_BROWSER = "zh-CN,zh;q=0.9,en;q=0.8"


def test_the_locked_message_counts_minutes_in_both_languages() -> None:
    """One minute, several minutes (rounded up); in Chinese, one form for both."""
    with translation.override("en"):
        assert locked_message(60).endswith("try again in 1 minute.")
        assert locked_message(61).endswith("try again in 2 minutes.")
        assert locked_message(600).endswith("try again in 10 minutes.")
    with translation.override("zh-hans"):
        assert locked_message(60) == (
            "这个账号或这个地址登录失败的次数太多。登录暂时被锁定：请在 1 分钟后再试。"
        )
        assert "请在 10 分钟后再试" in locked_message(600)


def test_a_chinese_browser_gets_the_login_page_and_its_lockout_in_chinese(settings) -> None:
    """Django's own admin login page, in Chinese for zh-CN; the lockout message too, with the
    same 429 and Retry-After as in English."""
    settings.CHATSITE_LOGIN_LIMITS = {
        "FAILURES_PER_ACCOUNT": 2,
        "FAILURES_PER_ADDRESS": 100,
        "LOCKOUT_S": 600,
    }
    zh = Client(headers={"accept-language": ZH_BROWSER})
    page = zh.get("/admin/login/?next=/dashboard/")
    html = page.content.decode()
    assert page.status_code == 200
    assert '<html lang="zh-hans"' in html
    assert "用户名" in html and "密码" in html and 'value="登录"' in html
    english = Client(headers={"accept-language": "en-US"}).get("/admin/login/").content.decode()
    assert "Username" in english and 'value="Log in"' in english

    for _ in range(2):
        login_failed(username="wang", client="192.0.2.10")
    for client, expected in (
        (zh, "登录失败的次数太多。登录暂时被锁定：请在 10 分钟后再试。"),
        (Client(headers={"accept-language": "en-US"}), "try again in 10 minutes."),
    ):
        locked = client.post(
            "/admin/login/?next=/dashboard/",
            {"username": "wang", "password": PASSWORD, "next": "/dashboard/"},
        )
        assert locked.status_code == 429
        assert 540 <= int(locked.headers["retry-after"]) <= 600
        assert expected in locked.content.decode()
