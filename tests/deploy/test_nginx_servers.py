"""chatsite-servers.conf through the real nginx: the students split by session between a pool of
Daphne workers and a pool of uvicorn workers (``python -m chatsite.server`` and
``python -m chatsite.uvicorn_server``, on the tests' database). Each stream record names the
server of the worker that served it, and the staff dashboard's figures compare the two."""

import itertools
import re
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from assistant.benchmarking.ports import free_port
from assistant.models import StreamRecord
from assistant.services.dashboard import traffic_snapshot
from tests.deploy.test_nginx import (
    Cookies,
    answer,
    dropped_and_resumed,
    meta_of,
    page_visit,
    tokens_of,
)
from tests.support import LiveServer, NginxServer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SITE = "chatsite-servers.conf"
MESSAGE = "[scripted tokens=2 ttft_ms=0] Which server?"

_sources = itertools.count()


@pytest.fixture(scope="module")
def pools(daphne_factory, uvicorn_factory) -> dict[str, LiveServer]:
    """One worker per pool, each keeping a dropped answer 5 s for its resume."""
    return {
        "daphne": daphne_factory(CHATSITE_RESUME_GRACE_S="5"),
        "uvicorn": uvicorn_factory(CHATSITE_RESUME_GRACE_S="5"),
    }


@pytest.fixture(scope="module")
def site(nginx_factory, pools: dict[str, LiveServer]) -> NginxServer:
    return nginx_factory(SITE, [pools["daphne"].port], uvicorn_workers=[pools["uvicorn"].port])


def visitor(site: NginxServer) -> tuple[Cookies, str]:
    """A new session from a loopback address of its own (nginx limits what one address asks)."""
    number = next(_sources)
    source = f"127.0.{2 + number // 250}.{1 + number % 250}"
    return page_visit(site.port, source), source


def record_of(request_id: str) -> StreamRecord:
    return wait_for(lambda: StreamRecord.objects.filter(request_id=request_id).first())


def upstream_of(site: NginxServer, request_id: str) -> str:
    """The worker addresses and statuses nginx logged for ``request_id`` (up=..., us=...)."""

    def line() -> str | None:
        return next((x for x in site.access_lines() if f"rid={request_id} " in x), None)

    found = re.search(r"up=(\S+(?: : \S+)?) us=(.*)$", wait_for(line))
    assert found, line()
    return f"{found[1]} {found[2]}"


def test_sessions_split_between_the_servers_and_stay(
    site: NginxServer, pools: dict[str, LiveServer]
) -> None:
    """About half of the sessions go to each pool (50 % as shipped), every answer of a session
    to the same one; each record names the server of the worker nginx sent it to; the
    dashboard counts each server's answers."""
    by_session: dict[str, set[str]] = {}
    request_ids: dict[str, list[str]] = {"daphne": [], "uvicorn": []}
    for _ in range(40):
        cookies, source = visitor(site)
        for _ in range(2):
            _, events = answer(site.port, cookies, MESSAGE, source=source)
            assert events[-1].event == "done", events
            request_id = meta_of(events)["request_id"]
            server = record_of(request_id).server
            by_session.setdefault(cookies["sessionid"], set()).add(server)
            request_ids[server].append(request_id)
            port = pools[server].port
            assert upstream_of(site, request_id) == f"127.0.0.1:{port} 200", server

    assert all(len(servers) == 1 for servers in by_session.values()), by_session
    shares = {name: len(ids) / 80 for name, ids in request_ids.items()}
    assert 0.2 <= shares["uvicorn"] <= 0.8, shares

    servers = traffic_snapshot(window_s=300, baseline="direct", candidate="django")["servers"]
    # Workers of earlier tests may store an answer after those tests' tables were emptied (one
    # that ran on for its resume grace): the dashboard counts what the database holds.
    stored = Counter(
        StreamRecord.objects.filter(created_at__gte=timezone.now() - timedelta(seconds=300))
        .exclude(server="")
        .values_list("server", flat=True)
    )
    assert {name: figures["requests"] for name, figures in servers.items()} == stored
    assert all(stored[name] >= len(ids) for name, ids in request_ids.items()), stored


def test_a_dropped_answer_resumes_in_its_sessions_pool(site: NginxServer) -> None:
    """A resume follows the session to its pool and its worker, on either server, and brings
    exactly the tokens that were missing."""
    resumed_on: set[str] = set()
    for _ in range(40):
        cookies, source = visitor(site)
        request_id, after = dropped_and_resumed(site.port, cookies, tokens=8, source=source)
        assert [int(e.id) for e in tokens_of(after)] == list(range(4, 9))
        assert after[-1].event == "done"
        resumed_on.add(record_of(request_id).server)
        if resumed_on == {"daphne", "uvicorn"}:
            return
    pytest.fail(f"40 sessions resumed on {resumed_on} only")


@pytest.fixture
def uvicorn_pool_down(nginx_factory, pools: dict[str, LiveServer]) -> Iterator[NginxServer]:
    """The site with nothing listening where its uvicorn pool should be."""
    yield nginx_factory(SITE, [pools["daphne"].port], uvicorn_workers=[free_port()])


def test_a_pool_that_is_down_sends_its_questions_to_the_other(
    uvicorn_pool_down: NginxServer, pools: dict[str, LiveServer]
) -> None:
    """The sessions of a pool with no worker answering get their whole answer from the other
    pool: nginx's own 502 there sends the question on, once."""
    site, daphne = uvicorn_pool_down, pools["daphne"].port
    for _ in range(40):
        cookies, source = visitor(site)
        _, events = answer(site.port, cookies, MESSAGE, source=source)
        assert len(tokens_of(events)) == 2 and events[-1].event == "done"
        request_id = meta_of(events)["request_id"]
        assert record_of(request_id).server == "daphne"
        assert StreamRecord.objects.filter(request_id=request_id).count() == 1
        logged = upstream_of(site, request_id)
        if logged != f"127.0.0.1:{daphne} 200":
            assert re.fullmatch(rf"127\.0\.0\.1:\d+ : 127\.0\.0\.1:{daphne} 502 : 200", logged)
            return
    pytest.fail("no session of 40 was sent to the uvicorn pool")
