"""The staff dashboard's live stream checks, every ``CHATSITE_DASHBOARD_RECHECK_S`` (1 s here),
that its viewer is still staff, over real HTTP on a real Daphne: a viewer demoted, deactivated
or logged out everywhere gets a ``forbidden`` event and the end of the stream; a viewer still
staff keeps receiving snapshots."""

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model

from tests.support import LiveServer, SSEReader, staff_cookies

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(daphne_factory: Callable[..., LiveServer]) -> LiveServer:
    return daphne_factory(CHATSITE_DASHBOARD_RECHECK_S="1")


def watch(
    server: LiveServer, cookies: dict[str, str], change: Callable[[], None], *, seconds: float
) -> tuple[list[str], bool]:
    """Open the live stream, run ``change`` once the first snapshot came, and read for up to
    ``seconds``: the events' names, and whether the server ended the stream."""
    reader = SSEReader()
    names: list[str] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=server.url, cookies=cookies, timeout=seconds + 10) as client:
        with client.stream("GET", "/dashboard/events?window=5m") as response:
            assert response.status_code == 200
            for chunk in response.iter_raw():
                for event in reader.feed(chunk):
                    names.append(event.event)
                    if event.event == "forbidden":
                        assert json.loads(event.data)["error"]["code"] == "staff_only"
                    if names.count("snapshot") == 1 and event.event == "snapshot":
                        change()
                if time.monotonic() > deadline:
                    return names, False
    return names, True


def demote(user: Any) -> Callable[[], None]:
    return lambda: get_user_model().objects.filter(pk=user.pk).update(is_staff=False)


def deactivate(user: Any) -> Callable[[], None]:
    return lambda: get_user_model().objects.filter(pk=user.pk).update(is_active=False)


def password_changed(user: Any) -> Callable[[], None]:
    """What ends every session of an account ("log out everywhere"): its session hash no
    longer matches."""

    def change() -> None:
        fresh = get_user_model().objects.get(pk=user.pk)
        fresh.set_password("a-new-password-for-everywhere")
        fresh.save()

    return change


@pytest.mark.parametrize("how", [demote, deactivate, password_changed], ids=lambda f: f.__name__)
def test_a_viewer_who_is_no_longer_staff_is_cut_off(
    server: LiveServer, how: Callable[[Any], Callable[[], None]]
) -> None:
    user, cookies = staff_cookies(f"staff-{how.__name__}")
    names, ended = watch(server, cookies, how(user), seconds=15)
    assert ended and names[-1] == "forbidden", names
    # The reconnection the browser would make is refused.
    again = httpx.get(f"{server.url}/dashboard/events", cookies=cookies, timeout=10)
    assert again.status_code in (401, 403)


def test_a_viewer_still_staff_keeps_receiving(server: LiveServer) -> None:
    """Over three re-checks nothing changes: snapshots keep coming, no ``forbidden``."""
    _user, cookies = staff_cookies("staff-kept")
    names, ended = watch(server, cookies, lambda: None, seconds=3.5)
    assert not ended and "forbidden" not in names
    assert names.count("snapshot") >= 2, names
