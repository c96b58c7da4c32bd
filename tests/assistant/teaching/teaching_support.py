"""What the teachers' pages' tests share (``test_teaching.py``): the people in a small school,
each with the browser they would use, and what a refused request must leave unchanged."""

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client

from assistant.models import ClassMember, Classroom
from assistant.services.teaching import class_create, teacher_create

PASSWORD = "pw-long-enough-123"
NEW_PASSWORD = "another-pw-456789"
User = get_user_model()


def fresh_start(settings: Any) -> Iterator[None]:
    """Each test's start (an autouse fixture yields from it). Join tries and failed logins are
    counted per address in the cache, and every test client is 127.0.0.1: none are left from
    another test. A fast password hash: the default's deliberate slowness, paid for four
    accounts in each of a hundred tests, would be most of their time; checking passwords works
    the same."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()
    yield
    cache.clear()


def join(code: str, nickname: str) -> Client:
    """A student: no account, a session that joined a class with its code."""
    student = Client()
    response = student.post("/c/", {"code": code, "nickname": nickname})
    assert response.status_code == 302 and response["Location"] == "/", response.content
    return student


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@dataclass
class World:
    """Two teachers with a class each, an admin, an account that may not teach, and a student
    in each class."""

    lin: Any
    mei: Any
    admin: Any
    account: Any
    physics: Classroom
    chemistry: Classroom
    clients: dict[str, Client] = field(default_factory=dict)

    def client(self, role: str) -> Client:
        if role not in self.clients:
            self.clients[role] = {
                "teacher": lambda: logged_in(self.lin),
                "other_teacher": lambda: logged_in(self.mei),
                "admin": lambda: logged_in(self.admin),
                "account": lambda: logged_in(self.account),
                "student": lambda: join(self.physics.join_code, "Ada"),
                "other_student": lambda: join(self.chemistry.join_code, "Bo"),
                "anonymous": Client,
            }[role]()
        return self.clients[role]

    def actor(self, role: str) -> Any:
        return {"teacher": self.lin, "other_teacher": self.mei, "admin": self.admin}[role]


def world_make() -> World:
    lin = teacher_create(username="lin", password=PASSWORD)
    mei = teacher_create(username="mei", password=PASSWORD)
    admin = User.objects.create_user("root", password=PASSWORD, is_staff=True)
    account = User.objects.create_user("visitor", password=PASSWORD)
    physics = class_create(name="Physics 7A", teacher=lin, persona="Old persona", temperature=0.7)
    chemistry = class_create(name="Chemistry 9B", teacher=mei)
    return World(lin, mei, admin, account, physics, chemistry)


def snapshot() -> tuple[list[dict[str, Any]], ...]:
    """Everything a teacher's page or action could change."""
    return (
        list(Classroom.objects.order_by("id").values()),
        list(Classroom.teachers.through.objects.order_by("id").values()),
        list(ClassMember.objects.order_by("id").values()),
        list(User.objects.order_by("id").values("id", "password")),
    )


def class_url(world: World, action: str = "") -> str:
    return f"/teach/{world.physics.id}/{action}"


def settings_form(**changes: Any) -> dict[str, Any]:
    form = {
        "name": "Physics 7A",
        "persona": "You are a patient physics tutor.",
        "temperature": "0.3",
        "max_tokens": "256",
        "engine_alias": "",
        "chat_rate": "10",
        "code_expires_at": "",
        "zone": "",
        "teachers_read": "on",
    }
    form.update(changes)
    return {k: v for k, v in form.items() if v is not None}


def form_token(client: Client, url: str) -> str:
    """The CSRF token of the form on ``url``, as a browser would post it."""
    page = client.get(url)
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert match is not None, page.content
    return match[1]


def teach_login(client: Client, username: str, password: str, next: str = "/teach/") -> Any:
    token = form_token(client, f"/teach/login/?next={next}")
    return client.post(
        f"/teach/login/?next={next}",
        {"username": username, "password": password, "next": next, "csrfmiddlewaretoken": token},
    )


def figures_by_id(client: Client, window: str = "1h") -> dict[str, dict[str, Any]]:
    """The teacher's figures (``/teach/api/figures``), by class id."""
    response = client.get(f"/teach/api/figures?window={window}")
    assert response.status_code == 200, response.content
    return {c["id"]: c for c in response.json()["classes"]}


def summary(count: int, p50: float | None, p95: float | None, p99: float | None) -> dict:
    """A TTFT summary as the figures give it."""
    return {"count": count, "p50": p50, "p95": p95, "p99": p99}


#: Everybody the access rules tell apart (``World.client``).
ROLES = ["teacher", "other_teacher", "admin", "student", "other_student", "anonymous", "account"]


def expected(role: str, *, of_class: bool) -> str:
    """What ``role`` gets from a teacher page or API: "ok", "login" (no login: the login page,
    or 401 from an API), "403" (logged in, not a teacher) or "404" (another teacher's class)."""
    if role in ("student", "other_student", "anonymous"):
        return "login"
    if role == "account":
        return "403"
    if role == "other_teacher" and of_class:
        return "404"
    return "ok"


def body_of(response: Any) -> bytes:
    """A response's body, a streamed one (the CSV export streams from an async iterator)
    included: consumed as the server would, without Django's warning for a sync consumer."""
    if not getattr(response, "streaming", False):
        return response.content

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()
