"""The staff dashboard's access rules, its JSON and the split control, and its live event stream
from a real Daphne."""

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assistant.dashboard_strings import DASHBOARD_STRINGS
from assistant.models import BreakerEvent, ServingState
from tests.support import ChatClient, LiveServer, SSEReader

pytestmark = pytest.mark.django_db(transaction=True)


def user(name: str, *, staff: bool) -> Client:
    account = get_user_model().objects.create_user(name, is_staff=staff)
    client = Client(enforce_csrf_checks=True)
    client.force_login(account)
    return client


@pytest.fixture
def staff() -> Client:
    return user("teacher", staff=True)


@pytest.fixture
def student() -> Client:
    return user("student", staff=False)


def test_anonymous_visitors_are_sent_to_the_login_page() -> None:
    response = Client().get("/dashboard/")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/dashboard/"
    api = Client().get("/dashboard/api/snapshot")
    assert api.status_code == 401
    assert api.json()["error"]["code"] == "login_required"


def test_non_staff_get_403(student: Client) -> None:
    page = student.get("/dashboard/")
    assert page.status_code == 403
    assert b"Staff only" in page.content
    for url in ("/dashboard/api/snapshot", "/dashboard/events"):
        response = student.get(url)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "staff_only"
    assert (
        student.post("/dashboard/api/split", {}, content_type="application/json").status_code == 403
    )


def test_staff_see_the_page_and_the_snapshot(staff: Client) -> None:
    page = staff.get("/dashboard/")
    assert page.status_code == 200
    assert b'data-events-url="/dashboard/events"' in page.content
    snapshot = staff.get("/dashboard/api/snapshot?window=1h").json()
    assert snapshot["window"] == "1h" and snapshot["window_s"] == 3600
    assert set(snapshot["paths"]) == {"direct", "django", "api"}
    assert snapshot["paths"]["direct"]["role"] == "baseline"
    assert snapshot["paths"]["api"]["role"] == "api"
    assert snapshot["split"]["mode"] == "auto"
    assert snapshot["breaker"]["state"] == "closed"
    assert staff.get("/dashboard/api/snapshot?window=7d").status_code == 400


ZH_BROWSER = "zh-CN,zh;q=0.9,en;q=0.8"
STATIC = Path(__file__).resolve().parents[2] / "frontend" / "static" / "chatsite"


def page_strings(html: str) -> dict[str, str]:
    return json.loads(re.search(r'id="page-strings"[^>]*>(.*?)</script>', html, re.S)[1])


def test_a_chinese_browser_gets_the_dashboard_in_chinese(staff: Client) -> None:
    """zh-CN gets <html lang="zh-Hans">, Chinese headings, labels and window buttons, and its
    scripts' strings in Chinese; ids, values and data hooks are the same as in English."""
    zh = staff.get("/dashboard/", headers={"accept-language": ZH_BROWSER}).content.decode()
    assert '<html lang="zh-Hans">' in zh
    assert "<h1>流式仪表盘</h1>" in zh
    assert ">熔断器</h2>" in zh and ">流量分流</h2>" in zh
    assert '<label for="split-percent">候选路径比例（%）</label>' in zh
    assert '<option value="force_baseline">强制使用基线</option>' in zh
    assert 'data-window="24h"' in zh and 'title="最近 24 小时">24 小时</button>' in zh
    strings = page_strings(zh)
    assert strings["liveLive"] == "● 实时"
    assert strings["splitShare"] == "{percent}% 的新对话交给 {candidate}。"

    en = staff.get("/dashboard/", headers={"accept-language": "en-US"}).content.decode()
    assert '<html lang="en">' in en
    assert "<h1>Streaming dashboard</h1>" in en
    assert '<label for="split-percent">Candidate share (%)</label>' in en
    assert 'title="Last 24 hours">24h</button>' in en
    assert page_strings(en)["liveLive"] == "● live"
    for html in (zh, en):
        for hook in ('id="window-5m"', 'value="force_candidate"', 'id="ratio"', 'id="live"'):
            assert hook in html


def test_the_dashboard_scripts_ask_only_for_strings_the_page_has() -> None:
    """Every ``t("key")`` in the dashboard's modules is a key of DASHBOARD_STRINGS (a missing one
    would show the key itself), and every key appears in them."""
    text = "\n".join(
        source.read_text()
        for source in [STATIC / "dashboard.js", *(STATIC / "dashboard").glob("*.js")]
    )
    asked = set(re.findall(r'\b(?:t|textWith)\("(\w+)"', text))
    assert asked, "no t() calls found"
    assert asked - set(DASHBOARD_STRINGS) == set()
    quoted = set(re.findall(r'"(\w+)"', text))
    assert set(DASHBOARD_STRINGS) - quoted == set()


def csrf_token(client: Client) -> str:
    client.get("/dashboard/")
    return client.cookies["csrftoken"].value


def test_the_split_control_needs_the_csrf_token(staff: Client) -> None:
    body = json.dumps({"percent": 30})
    refused = staff.post("/dashboard/api/split", body, content_type="application/json")
    assert refused.status_code == 403
    # A JSON API answers JSON, as the dashboard's script expects, not Django's HTML page.
    assert refused.headers["Content-Type"] == "application/json"
    assert refused.json()["error"]["code"] == "csrf_failed"
    assert not BreakerEvent.objects.exists()


def test_staff_change_the_split_and_it_is_logged(staff: Client) -> None:
    token = csrf_token(staff)
    response = staff.post(
        "/dashboard/api/split",
        json.dumps({"percent": 30, "mode": "force_baseline"}),
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert response.status_code == 200, response.content
    split = response.json()["split"]
    assert (split["percent"], split["mode"], split["effective_percent"]) == (
        30,
        "force_baseline",
        0,
    )
    state = ServingState.objects.get(pk=1)
    assert (state.candidate_percent, state.mode, state.updated_by) == (
        30,
        "force_baseline",
        "teacher",
    )
    event = staff.get("/dashboard/api/snapshot").json()["breaker"]["events"][0]
    assert event["kind"] == "split_changed" and event["actor"] == "teacher"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"percent": 101}, "between 0 and 100"),
        ({"percent": "ten"}, "must be a number"),
        ({"percent": True}, "must be a number"),
        ({"mode": "sometimes"}, "mode must be one of"),
        ({}, "Send percent, mode or both"),
        ([], "not valid"),
    ],
)
def test_a_bad_split_gets_400_and_changes_nothing(
    staff: Client, body: object, message: str
) -> None:
    token = csrf_token(staff)
    response = staff.post(
        "/dashboard/api/split",
        json.dumps(body),
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert not BreakerEvent.objects.exists()


def snapshots(server: LiveServer, cookies: dict[str, str]) -> Iterator[dict]:
    reader = SSEReader()
    with httpx.Client(base_url=server.url, cookies=cookies, timeout=10) as client:
        with client.stream("GET", "/dashboard/events?window=5m") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for chunk in response.iter_raw():
                for event in reader.feed(chunk):
                    if event.event == "snapshot":
                        yield event.json()


def test_the_event_stream_pushes_new_figures_within_two_seconds(
    staff: Client, daphne: LiveServer, chat_client: ChatClient
) -> None:
    cookies = {"sessionid": staff.cookies["sessionid"].value}
    stream = snapshots(daphne, cookies)
    first = next(stream)
    before = first["paths"]["direct"]["requests"]
    chat_client.ask("[scripted tokens=2 ttft_ms=0]", url="/api/chat/stream/direct")
    sent = time.monotonic()
    for snapshot in stream:
        if snapshot["paths"]["direct"]["requests"] == before + 1:
            break
        assert time.monotonic() - sent < 3, "the new stream never showed up"
    assert time.monotonic() - sent < 3
    stream.close()
