"""API keys in the admin: adding one makes it with ``key_create`` and shows its text once, in
the response to the addition (never in a message, which a cookie would carry); no page shows a
digest; a key's name and rate may change, nothing else; the
"Revoke selected keys" action revokes the selected keys only; keys are never deleted."""

import hashlib
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from assistant.errors import Rejected
from assistant.models import ApiKey, Classroom
from assistant.services.api_keys import key_create, key_presented, key_read
from assistant.services.classrooms import join_code_new

pytestmark = pytest.mark.django_db

ADD = "/admin/assistant/apikey/add/"
LIST = "/admin/assistant/apikey/"
KEY = re.compile(r"csk-[a-z0-9]{10}-[A-Za-z0-9_-]{20,}")


@pytest.fixture
def root() -> User:
    return User.objects.create_superuser("root", "root@example.invalid", "pw-long-enough-123")


@pytest.fixture
def admin_client(root: User) -> Client:
    client = Client()
    client.force_login(root)
    return client


@pytest.fixture
def physics() -> Classroom:
    return Classroom.objects.create(name="Physics 7A", join_code=join_code_new())


def change_url(row: ApiKey) -> str:
    return f"/admin/assistant/apikey/{row.pk}/change/"


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_adding_a_key_shows_it_once_and_stores_only_its_hash(
    admin_client: Client, root: User, physics: Classroom
) -> None:
    form = admin_client.get(ADD).content.decode()
    assert 'name="name"' in form and 'name="classroom"' in form and 'name="rate"' in form
    assert 'name="digest"' not in form and 'name="prefix"' not in form
    added = admin_client.post(ADD, {"name": "bench", "classroom": str(physics.id), "rate": "9"})
    assert added.status_code == 200
    assert "no-store" in added["Cache-Control"]
    row = ApiKey.objects.get()
    html = added.content.decode()
    keys = KEY.findall(html)
    assert len(set(keys)) == 1
    key = keys[0]
    assert "will not be shown again" in html
    assert key not in str(added.cookies) and not messages_of(added)
    assert (row.name, row.classroom_id, row.rate, row.created_by_id) == (
        "bench",
        physics.id,
        9,
        root.id,
    )
    assert row.digest == hashlib.sha256(key.encode()).hexdigest()
    context, rate = key_read(key_presented(f"Bearer {key}"))
    assert context.classroom is not None and rate == 9
    for url in (LIST, change_url(row), f"{LIST}?q={row.prefix}"):
        page = admin_client.get(url)
        html = page.content.decode()
        assert page.status_code == 200 and row.prefix in html
        assert key not in html and row.digest not in html and 'name="digest"' not in html


def test_a_key_for_the_site_takes_no_class(admin_client: Client) -> None:
    admin_client.post(ADD, {"name": "site bench", "classroom": "", "rate": ""})
    row = ApiKey.objects.get()
    assert (row.classroom, row.rate) == (None, None)


def test_a_rate_of_zero_is_refused_and_makes_nothing(admin_client: Client) -> None:
    response = admin_client.post(ADD, {"name": "bench", "classroom": "", "rate": "0"})
    assert response.status_code == 200 and b"errornote" in response.content
    assert ApiKey.objects.count() == 0


def test_a_change_edits_the_name_and_rate_only(admin_client: Client, physics: Classroom) -> None:
    row, key = key_create(name="bench", classroom=None, created_by=None)
    page = admin_client.get(change_url(row)).content.decode()
    assert 'name="name"' in page and 'name="rate"' in page
    assert 'name="classroom"' not in page and 'name="digest"' not in page
    response = admin_client.post(
        change_url(row),
        {"name": "renamed", "rate": "3", "classroom": str(physics.id), "digest": "0" * 64},
    )
    assert response.status_code == 302
    after = ApiKey.objects.get(id=row.id)
    assert (after.name, after.rate) == ("renamed", 3)
    assert (after.classroom, after.digest, after.prefix) == (None, row.digest, row.prefix)
    assert key_read(key_presented(f"Bearer {key}"))[1] == 3


def test_the_revoke_action_revokes_the_selected_keys_only(admin_client: Client) -> None:
    chosen, chosen_key = key_create(name="chosen", classroom=None, created_by=None)
    kept, kept_key = key_create(name="kept", classroom=None, created_by=None)
    response = admin_client.post(
        LIST, {"action": "revoke_selected", "_selected_action": [str(chosen.pk)]}, follow=True
    )
    assert f"1 key revoked: csk-{chosen.prefix}-…." in messages_of(response)
    assert ApiKey.objects.get(id=chosen.id).revoked_at is not None
    assert ApiKey.objects.get(id=kept.id).revoked_at is None
    with pytest.raises(Rejected):
        key_read(key_presented(f"Bearer {chosen_key}"))
    key_read(key_presented(f"Bearer {kept_key}"))
    revoked = admin_client.get(f"{LIST}?revoked_at__isempty=0").content.decode()
    assert chosen.prefix in revoked and kept.prefix not in revoked


def test_keys_are_revoked_never_deleted(admin_client: Client) -> None:
    row, _ = key_create(name="bench", classroom=None, created_by=None)
    response = admin_client.post(f"/admin/assistant/apikey/{row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert ApiKey.objects.filter(id=row.id).exists()
    assert b"delete_selected" not in admin_client.get(LIST).content


def test_the_keys_admin_needs_staff(physics: Classroom) -> None:
    teacher = User.objects.create_user("lin", password="pw-long-enough-123")
    client = Client()
    client.force_login(teacher)
    response = client.post(ADD, {"name": "bench", "classroom": "", "rate": ""})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert ApiKey.objects.count() == 0
