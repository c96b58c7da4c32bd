"""A class as its teachers run it on ``/teach/``, through Django's test client on the real
database: a new class's code, a new code and a pause as students then meet them, settings kept
within the admin's bounds, and the admin's view of classes. (Who may use which page:
``test_teaching.py``.)"""

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from assistant.models import ClassMember, Classroom
from assistant.services.classrooms import CODE_ALPHABET, CODE_LENGTH
from assistant.teach_forms import PERSONA_EXAMPLES
from tests.assistant.teaching.teaching_support import (
    PASSWORD,
    World,
    class_url,
    join,
    logged_in,
    settings_form,
    snapshot,
)

pytestmark = pytest.mark.django_db

User = get_user_model()


def test_a_new_class_gets_a_join_code_and_its_creator_as_teacher(world: World) -> None:
    teacher = world.client("teacher")
    response = teacher.post("/teach/new", {"name": "Biology 8C"})
    created = Classroom.objects.get(name="Biology 8C")
    assert response["Location"] == f"/teach/{created.id}/"
    assert len(created.join_code) == CODE_LENGTH
    assert set(created.join_code) <= set(CODE_ALPHABET)
    assert list(created.teachers.all()) == [world.lin]
    assert created.paused is False
    page = Client().get(f"/c/{created.join_code}")
    assert page.status_code == 200 and "Biology 8C" in page.content.decode()
    assert teacher.post("/teach/new", {"name": "  "}).status_code == 400
    assert Classroom.objects.count() == 3


def test_a_new_join_code_stops_the_old_one(world: World) -> None:
    """The old code is unknown at once (404), the new one opens the class; the students already
    in it stay."""
    world.client("student")
    old = world.physics.join_code
    world.client("teacher").post(class_url(world, "code"))
    new = Classroom.objects.get(id=world.physics.id).join_code
    assert new != old and set(new) <= set(CODE_ALPHABET)
    assert Client().get(f"/c/{old}").status_code == 404
    assert Client().get(f"/c/{new}").status_code == 200
    assert ClassMember.objects.get(nickname="Ada").left_at is None
    page = world.client("teacher").get(class_url(world)).content.decode()
    assert f"http://testserver/c/{new}" in page and old not in page


def test_pausing_and_opening_the_class(world: World) -> None:
    teacher = world.client("teacher")
    assert teacher.post(class_url(world, "pause"), {"paused": "1"}).status_code == 303
    assert Classroom.objects.get(id=world.physics.id).paused is True
    assert b'id="class-paused"' in Client().get(f"/c/{world.physics.join_code}").content
    assert b'id="class-open"' in teacher.get(class_url(world)).content
    assert teacher.post(class_url(world, "pause"), {"paused": "0"}).status_code == 303
    assert Classroom.objects.get(id=world.physics.id).paused is False
    assert teacher.post(class_url(world, "pause"), {"paused": "yes"}).status_code == 400
    assert teacher.post(class_url(world, "pause")).status_code == 400
    assert Classroom.objects.get(id=world.physics.id).paused is False


OUT_OF_BOUNDS = [
    ("temperature", "-0.1", "Ensure this value is greater than or equal to 0."),
    ("temperature", "1.51", "Ensure this value is less than or equal to 1.5."),
    ("temperature", "nan", "Enter a number."),
    ("max_tokens", "0", "Ensure this value is greater than or equal to 1."),
    ("max_tokens", "1025", "Ensure this value is less than or equal to 1024."),
    ("chat_rate", "0", "Ensure this value is greater than or equal to 1."),
    ("chat_rate", "121", "Ensure this value is less than or equal to 120."),
    ("engine_alias", "gpt-unknown", "Select a valid choice. gpt-unknown is not one of"),
    ("name", "", "This field is required."),
    ("persona", "x" * 4001, "Ensure this value has at most 4000 characters"),
    ("code_expires_at", "next week", "Enter a valid date/time."),
    ("zone", "Mars/Olympus_Mons", "Unknown time zone."),
]


@pytest.mark.parametrize(("name", "value", "message"), OUT_OF_BOUNDS, ids=lambda v: str(v)[:20])
def test_a_setting_out_of_bounds_is_refused(world: World, name: str, value: str, message: str):
    """400, the form again with the error beside the field, and the class as it was."""
    before = snapshot()
    response = world.client("teacher").post(class_url(world), settings_form(**{name: value}))
    assert response.status_code == 400
    html = response.content.decode()
    assert f'id="id_{name}_error">{message}' in html
    assert 'id="form-errors"' in html
    assert snapshot() == before


IN_BOUNDS = [
    (
        {"temperature": "0", "max_tokens": "1", "chat_rate": "1", "engine_alias": "default"},
        {"temperature": 0.0, "max_tokens": 1, "chat_rate": 1, "engine_alias": "default"},
    ),
    (
        {"temperature": "1.5", "max_tokens": "1024", "chat_rate": "120"},
        {"temperature": 1.5, "max_tokens": 1024, "chat_rate": 120, "engine_alias": ""},
    ),
    (
        {"temperature": "", "max_tokens": "", "chat_rate": "", "teachers_read": None},
        {"temperature": None, "max_tokens": None, "chat_rate": None, "teachers_read": False},
    ),
]


@pytest.mark.parametrize(("sent", "stored"), IN_BOUNDS)
def test_settings_within_bounds_are_stored(world: World, sent: dict, stored: dict) -> None:
    response = world.client("teacher").post(class_url(world), settings_form(**sent))
    assert response.status_code == 303
    row = Classroom.objects.filter(id=world.physics.id).values(*stored).get()
    assert row == stored
    page = world.client("teacher").get(class_url(world)).content.decode()
    assert "Settings saved." in page


def test_the_bounds_are_the_admins_setting_at_the_time(world: World, settings: Any) -> None:
    settings.CHATSITE_CLASS_BOUNDS = {
        "TEMPERATURE_MAX": 1.0,
        "MAX_TOKENS_MAX": 64,
        "CHAT_RATE_MAX": 5,
    }
    teacher = world.client("teacher")
    for changes in ({"temperature": "1.2"}, {"max_tokens": "65"}, {"chat_rate": "6"}):
        assert teacher.post(class_url(world), settings_form(**changes)).status_code == 400
    page = teacher.get(class_url(world)).content.decode()
    assert 'name="max_tokens" min="1" max="64"' in page
    ok = settings_form(temperature="1.0", max_tokens="64", chat_rate="5")
    assert teacher.post(class_url(world), ok).status_code == 303


def test_the_code_expiry_is_read_in_the_teachers_time_zone(world: World) -> None:
    """What the teacher typed is their browser's wall-clock time (the zone teach.js sends);
    without a zone, the site's (UTC). Empty: never."""
    teacher = world.client("teacher")
    typed = settings_form(code_expires_at="2030-01-02T08:30", zone="Asia/Shanghai")
    assert teacher.post(class_url(world), typed).status_code == 303
    stored = Classroom.objects.get(id=world.physics.id).code_expires_at
    assert stored == datetime(2030, 1, 2, 0, 30, tzinfo=UTC)
    page = teacher.get(class_url(world)).content.decode()
    assert 'data-utc="2030-01-02T00:30:00+00:00"' in page
    assert 'value="2030-01-02T00:30"' in page  # the site's zone until teach.js converts it
    teacher.post(class_url(world), settings_form(code_expires_at="2030-01-02T08:30"))
    stored = Classroom.objects.get(id=world.physics.id).code_expires_at
    assert stored == datetime(2030, 1, 2, 8, 30, tzinfo=UTC)
    teacher.post(class_url(world), settings_form(code_expires_at=""))
    assert Classroom.objects.get(id=world.physics.id).code_expires_at is None


def test_an_expired_code_no_longer_opens_the_class(world: World) -> None:
    world.client("teacher").post(
        class_url(world), settings_form(code_expires_at="2020-01-01T00:00")
    )
    assert Client().get(f"/c/{world.physics.join_code}").status_code == 410


def test_the_class_page_offers_persona_examples_in_both_languages(world: World) -> None:
    """Visible text without JavaScript (the buttons are shown by teach.js); no inline script or
    style (the CSP forbids them)."""
    html = world.client("teacher").get(class_url(world)).content.decode()
    assert "do not hand out homework answers" in html
    assert "不直接给出作业答案" in html
    for example in PERSONA_EXAMPLES:
        assert f'<p lang="en">{example.en}</p>' in html
        assert f'<p lang="zh-Hans">{example.zh}</p>' in html
    assert html.count("data-persona-use hidden") == 2 * len(PERSONA_EXAMPLES) >= 6
    assert '<script type="module" src="/static/chatsite/teach.js">' in html
    assert re.findall(r"<script(?![^>]*\ssrc=)[^>]*>", html) == []
    assert "<style" not in html and " style=" not in html
    assert '<option value="" selected>' in html and '<option value="default">' in html


def test_the_list_and_the_class_page_show_who_is_in_the_class_now(world: World) -> None:
    world.client("student")
    join(world.physics.join_code, "")
    leaver = join(world.physics.join_code, "Di")
    assert leaver.post("/c/leave").status_code == 302
    teacher = world.client("teacher")
    listing = teacher.get("/teach/").content.decode()
    assert re.findall(r'class="students">(\d+)<', listing) == ["2"]
    assert f"http://testserver/c/{world.physics.join_code}" in listing
    page = teacher.get(class_url(world)).content.decode()
    members = re.search(r'<table id="members">.*?</table>', page, re.S)
    assert members is not None
    names = re.findall(r"<tr><td>([^<]*)</td>", members[0])
    assert sorted(names) == ["Ada", "—"]


def test_admins_manage_classes_in_the_admin(world: World) -> None:
    """Classes are searchable and edited there; who joined is shown, never edited."""
    admin = logged_in(User.objects.create_superuser("boss", password=PASSWORD))
    world.client("student")
    listing = admin.get("/admin/assistant/classroom/?q=Physics").content.decode()
    assert "Physics 7A" in listing and "Chemistry 9B" not in listing
    change = admin.get(f"/admin/assistant/classroom/{world.physics.id}/change/")
    assert change.status_code == 200
    assert "Ada" in change.content.decode() and "selectfilter" in change.content.decode()
    member = ClassMember.objects.get(nickname="Ada")
    assert admin.get("/admin/assistant/classmember/add/").status_code == 403
    deleting = admin.post(f"/admin/assistant/classmember/{member.id}/delete/", {"post": "yes"})
    assert deleting.status_code == 403
    assert ClassMember.objects.filter(id=member.id).exists()
