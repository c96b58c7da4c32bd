"""The teachers' pages (``/teach/``) and who may use them, through Django's test client on the
real database: every page and action refuses whoever may not use it (login, 403 or 404, and
nothing stored); the teachers' login is throttled like the admin's; a teacher changes their own
password. (What a class's pages do: ``test_teaching_classes.py``.)"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assistant.models import Classroom
from tests.assistant.teaching.teaching_support import (
    NEW_PASSWORD,
    PASSWORD,
    ROLES,
    World,
    class_url,
    expected,
    form_token,
    settings_form,
    snapshot,
    teach_login,
)

pytestmark = pytest.mark.django_db

User = get_user_model()


# What each page or action does for somebody allowed to use it.


def shows_own_classes(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    html = response.content.decode()
    seen = {c.name for c in (world.physics, world.chemistry) if c.name in html}
    codes = {c.name for c in (world.physics, world.chemistry) if c.join_code in html}
    expected = {
        "teacher": {"Physics 7A"},
        "other_teacher": {"Chemistry 9B"},
        "admin": {"Physics 7A", "Chemistry 9B"},
    }[role]
    assert seen == codes == expected


def shows_form(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    assert b'<form method="post"' in response.content


def creates_class(response: Any, world: World, role: str) -> None:
    created = Classroom.objects.get(name="Biology 8C")
    assert response.status_code == 303
    assert response["Location"] == f"/teach/{created.id}/"
    assert list(created.teachers.all()) == [world.actor(role)]


def shows_class(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    html = response.content.decode()
    assert f"http://testserver/c/{world.physics.join_code}" in html
    assert "Old persona" in html


def saves_settings(response: Any, world: World, role: str) -> None:
    assert response.status_code == 303 and response["Location"] == class_url(world)
    stored = Classroom.objects.get(id=world.physics.id)
    assert stored.persona == "You are a patient physics tutor."
    assert (stored.temperature, stored.max_tokens, stored.chat_rate) == (0.3, 256, 10)
    assert stored.teachers_read is True


def rotates_code(response: Any, world: World, role: str) -> None:
    assert response.status_code == 303 and response["Location"] == class_url(world)
    assert Classroom.objects.get(id=world.physics.id).join_code != world.physics.join_code


def pauses(response: Any, world: World, role: str) -> None:
    assert response.status_code == 303 and response["Location"] == class_url(world)
    assert Classroom.objects.get(id=world.physics.id).paused is True


def changes_password(response: Any, world: World, role: str) -> None:
    assert response.status_code == 302 and response["Location"] == "/teach/password/done/"
    assert User.objects.get(id=world.actor(role).id).check_password(NEW_PASSWORD)


def says_password_changed(response: Any, world: World, role: str) -> None:
    assert response.status_code == 200
    assert b'id="password-changed"' in response.content


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    url: Callable[[World], str]
    ok: Callable[[Any, World, str], None]
    data: dict[str, str] | None = None
    #: Whether it concerns the class (a teacher of another class gets 404).
    of_class: bool = False
    #: Where the login page sends the user back to.
    back: Callable[[World], str] | None = None

    def send(self, client: Client, world: World) -> Any:
        if self.method == "get":
            return client.get(self.url(world))
        return client.post(self.url(world), self.data or {})


ENDPOINTS = [
    Endpoint("list", "get", lambda w: "/teach/", shows_own_classes),
    Endpoint("new-page", "get", lambda w: "/teach/new", shows_form),
    Endpoint("new", "post", lambda w: "/teach/new", creates_class, {"name": "Biology 8C"}),
    Endpoint("class-page", "get", class_url, shows_class, of_class=True),
    Endpoint("settings", "post", class_url, saves_settings, settings_form(), of_class=True),
    Endpoint(
        "code", "post", lambda w: class_url(w, "code"), rotates_code, of_class=True, back=class_url
    ),
    Endpoint(
        "pause",
        "post",
        lambda w: class_url(w, "pause"),
        pauses,
        {"paused": "1"},
        of_class=True,
        back=class_url,
    ),
    Endpoint("password-page", "get", lambda w: "/teach/password/", shows_form),
    Endpoint(
        "password",
        "post",
        lambda w: "/teach/password/",
        changes_password,
        {
            "old_password": PASSWORD,
            "new_password1": NEW_PASSWORD,
            "new_password2": NEW_PASSWORD,
        },
    ),
    Endpoint("password-done", "get", lambda w: "/teach/password/done/", says_password_changed),
]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_what_it_may_on_each_page(world: World, role: str, endpoint: Endpoint):
    """Teachers use their own classes, admins every class; another teacher's class is 404;
    students (a joined session, no login) and visitors go to the login page; an account that
    may not teach gets 403. A refusal changes nothing."""
    client = world.client(role)
    before = snapshot()
    response = endpoint.send(client, world)
    outcome = expected(role, of_class=endpoint.of_class)
    if outcome == "ok":
        endpoint.ok(response, world, role)
        return
    assert snapshot() == before
    if outcome == "login":
        back = (endpoint.back or endpoint.url)(world)
        assert response.status_code == 302
        assert response["Location"] == f"/teach/login/?next={back}"
    elif outcome == "404":
        assert response.status_code == 404
        assert world.physics.join_code not in response.content.decode()
    else:
        assert response.status_code == 403
        assert b"Teachers only" in response.content


def test_a_teacher_logs_in_at_the_teachers_login(world: World) -> None:
    """A teacher (not staff) logs in at /teach/login/, CSRF checked as for a browser, and lands
    on the page they were sent from."""
    browser = Client(enforce_csrf_checks=True)
    assert browser.get(class_url(world))["Location"] == f"/teach/login/?next={class_url(world)}"
    response = teach_login(browser, "lin", PASSWORD, next=class_url(world))
    assert response.status_code == 302 and response["Location"] == class_url(world)
    assert world.lin.is_staff is False
    assert browser.get(class_url(world)).status_code == 200
    plain = teach_login(Client(enforce_csrf_checks=True), "mei", PASSWORD, next="")
    assert plain.status_code == 302 and plain["Location"] == "/teach/"


def test_the_teachers_login_refuses_accounts_that_may_not_teach(world: World) -> None:
    """An account outside the Teachers group is refused as a wrong password is; staff log in."""
    browser = Client()
    refused = teach_login(browser, "visitor", PASSWORD)
    assert refused.status_code == 200
    assert "Please enter a correct username and password" in refused.content.decode()
    assert "_auth_user_id" not in browser.session
    assert teach_login(Client(), "root", PASSWORD)["Location"] == "/teach/"


def test_the_teachers_login_is_throttled_like_the_admins(world: World, settings: Any) -> None:
    """After the configured failures the account is locked: 429 with Retry-After and the
    lockout message, the right password included, on both logins (one throttle)."""
    settings.CHATSITE_LOGIN_LIMITS = {
        "FAILURES_PER_ACCOUNT": 3,
        "FAILURES_PER_ADDRESS": 100,
        "LOCKOUT_S": 600,
    }
    browser = Client()
    statuses = [teach_login(browser, "lin", f"guess-{n}").status_code for n in range(3)]
    locked = teach_login(browser, "lin", PASSWORD)
    assert statuses == [200, 200, 200]
    assert locked.status_code == 429
    assert 540 <= int(locked["Retry-After"]) <= 600
    assert "try again in 10 minutes" in locked.content.decode()
    assert browser.get("/teach/").status_code == 302  # not logged in
    assert Client().post("/admin/login/", {"username": "lin", "password": "x"}).status_code == 429
    assert teach_login(Client(), "mei", PASSWORD).status_code == 302


def test_logging_out_takes_a_post(world: World) -> None:
    browser = world.client("teacher")
    assert browser.get("/teach/logout/").status_code == 405
    assert browser.get("/teach/").status_code == 200
    response = browser.post("/teach/logout/")
    assert response.status_code == 302 and response["Location"] == "/teach/login/"
    assert browser.get("/teach/")["Location"] == "/teach/login/?next=/teach/"


def test_a_teacher_changes_their_own_password(world: World) -> None:
    """The new password logs in, the old one no longer does; the session that changed it stays
    logged in. A wrong old password changes nothing."""
    browser = Client(enforce_csrf_checks=True)
    teach_login(browser, "lin", PASSWORD)
    form = {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
    wrong = browser.post(
        "/teach/password/",
        {**form, "old_password": "nope", "csrfmiddlewaretoken": form_token(browser, "/teach/")},
    )
    assert wrong.status_code == 200 and User.objects.get(username="lin").check_password(PASSWORD)
    changed = browser.post(
        "/teach/password/",
        {**form, "old_password": PASSWORD, "csrfmiddlewaretoken": form_token(browser, "/teach/")},
    )
    assert changed.status_code == 302 and changed["Location"] == "/teach/password/done/"
    assert browser.get("/teach/").status_code == 200
    assert teach_login(Client(), "lin", PASSWORD).status_code == 200  # the form again
    assert teach_login(Client(), "lin", NEW_PASSWORD)["Location"] == "/teach/"


def test_actions_need_the_csrf_token(world: World) -> None:
    teacher = Client(enforce_csrf_checks=True)
    teacher.force_login(world.lin)
    before = snapshot()
    for url, data in [
        (class_url(world, "pause"), {"paused": "1"}),
        (class_url(world, "code"), {}),
        (class_url(world), settings_form()),
        ("/teach/new", {"name": "Biology 8C"}),
    ]:
        assert teacher.post(url, data).status_code == 403
    assert snapshot() == before
