"""The worker's page line (services/page_line.py, PageLineMiddleware) and the refusals a page load
gets instead of an error page (assistant/busy.py): a full line and a database that could not
serve are 503 with Retry-After, the busy page to a navigation and JSON to anything else."""

import asyncio
import json
import re

import pytest
from django.core.exceptions import DisallowedHost, RequestDataTooBig, SuspiciousOperation
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.test import RequestFactory

from assistant.busy import bad_request, server_error, wants_page
from assistant.middleware import PageLineMiddleware
from assistant.services.page_line import RETRY_S, PageLine, page_line

NAVIGATION = "text/html,application/xhtml+xml,*/*;q=0.8"


async def test_the_line_runs_at_most_at_once_and_lets_the_rest_in_in_order() -> None:
    line = PageLine(at_once=2, wait_s=30)
    assert await line.enter() and await line.enter()
    order: list[int] = []

    async def wait(number: int) -> None:
        assert await line.enter()
        order.append(number)

    waiting = [asyncio.create_task(wait(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    assert (line.running, line.waiting, order) == (2, 3, [])
    line.leave()
    await asyncio.sleep(0.01)
    assert order == [0]
    line.leave()
    line.leave()
    await asyncio.gather(*waiting)
    assert order == [0, 1, 2]
    assert (line.running, line.waiting) == (2, 0)


async def test_a_turn_that_does_not_come_in_time_is_refused() -> None:
    line = PageLine(at_once=1, wait_s=0.05)
    assert await line.enter()
    assert not await line.enter()
    assert (line.running, line.waiting) == (1, 0)
    line.leave()
    assert await line.enter()


async def _served(request: HttpRequest) -> HttpResponse:
    """The rest of the stack, as far as the line can tell: it answers."""
    return HttpResponse("served")


@pytest.fixture
def through_line(settings):
    """A request through PageLineMiddleware with this loop's line of one turn, which requests
    wait 50 ms for; ``held``: that turn is taken meanwhile."""
    settings.CHATSITE_PAGES = {"AT_ONCE": 1, "WAIT_S": 0.05}

    async def send(path: str, *, held: bool = True, **headers: str) -> HttpResponse:
        line = page_line()
        assert line is not None
        if held:
            assert await line.enter()
        try:
            request = RequestFactory().get(path, headers=headers)
            return await PageLineMiddleware(_served)(request)
        finally:
            if held:
                line.leave()

    return send


def _retry_after(response: HttpResponse) -> int:
    wait = int(response.headers["Retry-After"])
    assert RETRY_S[0] <= wait <= RETRY_S[1]
    return wait


async def test_a_page_load_that_waits_too_long_gets_the_busy_page(through_line) -> None:
    response = await through_line("/", accept=NAVIGATION)
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert response["Cache-Control"] == "no-store"
    wait = _retry_after(response)
    page = response.content.decode()
    assert f'<meta http-equiv="refresh" content="{wait}">' in page
    assert "Many students are opening the site at once" in page
    assert getattr(response, "_has_been_logged", False)  # counted, not logged as an error
    assert response["X-Frame-Options"] == "DENY"


async def test_a_fetch_that_waits_too_long_gets_json_in_its_language(through_line) -> None:
    response = await through_line("/api/conversations", accept="*/*", accept_language="zh-CN")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    _retry_after(response)
    error = json.loads(response.content)["error"]
    assert error["code"] == "site_busy"
    assert re.search(r"[\u4e00-\u9fff]", error["message"]), error["message"]


async def test_a_free_line_lets_a_request_straight_through(through_line) -> None:
    response = await through_line("/", held=False, accept=NAVIGATION)
    assert response.content == b"served"
    line = page_line()
    assert line is not None and (line.running, line.waiting) == (0, 0)


async def test_a_page_load_waits_its_turn_and_is_served(settings) -> None:
    settings.CHATSITE_PAGES = {"AT_ONCE": 1, "WAIT_S": 30}
    line = page_line()
    assert line is not None and await line.enter()
    asyncio.get_running_loop().call_later(0.05, line.leave)
    response = await PageLineMiddleware(_served)(RequestFactory().get("/"))
    assert response.content == b"served"
    assert (line.running, line.waiting) == (0, 0)


async def test_a_turn_ends_when_the_work_does_not_when_its_client_leaves(settings) -> None:
    """A disconnect cancels the request; its synchronous part runs on (asgiref does not wait
    for its thread), so its turn is held until the work returns."""
    settings.CHATSITE_PAGES = {"AT_ONCE": 1, "WAIT_S": 30}
    line = page_line()
    assert line is not None
    returned = asyncio.Event()

    async def work(request: HttpRequest) -> HttpResponse:
        await returned.wait()
        return HttpResponse("too late")

    request = asyncio.ensure_future(PageLineMiddleware(work)(RequestFactory().get("/")))
    await asyncio.sleep(0.01)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert line.running == 1
    returned.set()
    await asyncio.sleep(0.01)
    assert line.running == 0


async def test_the_metrics_scrape_never_waits(through_line) -> None:
    response = await through_line("/metrics")
    assert response.content == b"served"


def test_no_line_when_at_once_is_zero(settings) -> None:
    settings.CHATSITE_PAGES = {"AT_ONCE": 0, "WAIT_S": 5}

    async def which() -> PageLine | None:
        return page_line()

    assert asyncio.run(which()) is None


def test_a_form_post_is_a_navigation_too() -> None:
    posted = RequestFactory().post("/c/", headers={"accept": NAVIGATION})
    assert wants_page(posted)
    fetched = RequestFactory().post("/api/chat/stream", headers={"accept": "text/event-stream"})
    assert not wants_page(fetched)


@pytest.mark.parametrize("accept", [NAVIGATION, "*/*"])
@pytest.mark.parametrize(
    ("failure", "status"),
    [
        (OperationalError("couldn't get a connection after 2.00 sec"), 503),
        (ValueError("a bug"), 500),
    ],
)
def test_only_a_database_that_could_not_serve_is_503_not_500(
    accept: str, failure: Exception, status: int
) -> None:
    """``handler500`` with the pool's timeout (Django raises it as OperationalError): 503 with
    Retry-After; any other failure stays a 500. A page to a navigation, JSON otherwise."""
    request = RequestFactory().get("/", headers={"accept": accept})
    try:
        raise failure
    except Exception:
        response = server_error(request)
    assert response.status_code == status
    kind = "text/html" if accept == NAVIGATION else "application/json"
    assert response["Content-Type"].startswith(kind)
    if status == 503:
        assert 2 <= int(response["Retry-After"]) <= 6
    else:
        assert "Retry-After" not in response
    if kind == "application/json":
        code = json.loads(response.content)["error"]["code"]
        assert code == ("database_unavailable" if status == 503 else "server_error")


@pytest.mark.parametrize("accept", [NAVIGATION, "*/*"])
@pytest.mark.parametrize(
    ("refused", "status", "code"),
    [
        (MultiPartParserError("Invalid boundary in multipart: None"), 400, "bad_request"),
        (DisallowedHost("Invalid HTTP_HOST header"), 400, "bad_host"),
        (
            RequestDataTooBig("Request body exceeded DATA_UPLOAD_MAX_MEMORY_SIZE."),
            413,
            "body_too_large",
        ),
        (SuspiciousOperation("anything else"), 400, "bad_request"),
    ],
)
def test_a_request_django_refuses_is_the_json_error_to_a_script(
    accept: str, refused: Exception, status: int, code: str
) -> None:
    """``handler400``: Django's own page (400) to a navigation, the JSON error the API answers
    with to anything else."""
    request = RequestFactory().post("/api/chat/beacon", headers={"accept": accept})
    response = bad_request(request, refused)
    if accept == NAVIGATION:
        assert (response.status_code, response["Content-Type"][:9]) == (400, "text/html")
    else:
        assert (response.status_code, response["Content-Type"]) == (status, "application/json")
        assert json.loads(response.content)["error"]["code"] == code
