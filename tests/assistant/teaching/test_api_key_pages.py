"""A class's API keys page (``/teach/<id>/keys``), through Django's test client on the real
database and, where a key must really work, the real API on a Daphne on loopback: a teacher
makes a key for their class, sees it once, and it answers ``/v1/models``; only its hash is
stored; a revoked key is refused at once; every role gets what the teacher pages' access rule
gives it, and a refusal changes nothing; bad input makes nothing."""

import hashlib
import re
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client

from assistant.models import ApiKey
from assistant.services.api_keys import key_create
from tests.assistant.teaching.teaching_support import (
    ROLES,
    World,
    class_url,
    expected,
    form_token,
    logged_in,
    snapshot,
)
from tests.support import LiveServer

pytestmark = pytest.mark.django_db

#: A key as the page shows it once: ``csk-<prefix>-<secret>``.
NEW_KEY = re.compile(r'<code id="new-key">(csk-([a-z0-9]{10})-[A-Za-z0-9_-]{20,})</code>')


def keys_url(world: World) -> str:
    return class_url(world, "keys")


def revoke_url(world: World, row: ApiKey) -> str:
    return class_url(world, f"keys/{row.id}/revoke")


def new_key_in(response: Any) -> str:
    match = NEW_KEY.search(response.content.decode())
    assert match is not None, response.content
    return match[1]


def keys_state() -> list[dict[str, Any]]:
    return list(ApiKey.objects.order_by("id").values())


def database_text() -> str:
    """Every row of every table, as text: where a stored secret would show."""
    parts = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            parts.extend(repr(row) for row in cursor.fetchall())
    return "\n".join(parts)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.django_db(transaction=True)
def test_a_teachers_new_key_is_shown_once_works_and_stops_when_revoked(
    daphne: LiveServer, world: World
) -> None:
    """The POST's own page shows the key (``no-store``) with how to use it; the key answers
    ``/v1/models`` on the real server; the database holds its SHA-256 and nowhere its text; the
    page never shows it again, only ``csk-<prefix>-…``; revoked, it is refused with 401."""
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(world.lin)
    page = browser.get(keys_url(world))
    assert page.status_code == 200 and "no-store" in page["Cache-Control"]
    created = browser.post(
        keys_url(world),
        {
            "name": "Lab notebook",
            "rate": "40",
            "csrfmiddlewaretoken": form_token(browser, keys_url(world)),
        },
    )
    assert created.status_code == 200 and "no-store" in created["Cache-Control"]
    key = new_key_in(created)
    html = created.content.decode()
    assert html.count(key) == 1
    assert '<code id="api-base">http://testserver/v1</code>' in html
    assert '<code id="api-model">chatsite</code>' in html
    assert "curl http://testserver/v1/chat/completions" in html

    row = ApiKey.objects.get()
    assert (row.name, row.classroom_id, row.created_by_id, row.rate) == (
        "Lab notebook",
        world.physics.id,
        world.lin.id,
        40,
    )
    assert row.digest == hashlib.sha256(key.encode()).hexdigest()
    secret = key.split("-", 2)[2]  # csk-<prefix>-<secret>: the secret may hold "-" itself
    stored = database_text()
    assert row.digest in stored and secret not in stored and key not in stored

    assert httpx.get(f"{daphne.url}/v1/models", headers=bearer(key)).status_code == 200

    listing = browser.get(keys_url(world)).content.decode()
    assert secret not in listing
    assert f"csk-{row.prefix}-…" in listing and "Lab notebook" in listing
    assert row.digest not in listing

    revoked = browser.post(
        revoke_url(world, row), {"csrfmiddlewaretoken": form_token(browser, keys_url(world))}
    )
    assert revoked.status_code == 303 and revoked["Location"] == keys_url(world)
    assert ApiKey.objects.get().revoked_at is not None
    refused = httpx.get(f"{daphne.url}/v1/models", headers=bearer(key))
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    after = browser.get(keys_url(world)).content.decode()
    assert "Revoked" in after and f'id="revoke-{row.prefix}"' not in after
    assert f"Key csk-{row.prefix}-… revoked: it is refused from now on." in after


# What each action does for somebody allowed to use it.


def lists_keys(response: Any, world: World, role: str, row: ApiKey) -> None:
    assert response.status_code == 200
    html = response.content.decode()
    assert f"csk-{row.prefix}-…" in html and row.digest not in html
    assert 'id="key-new"' in html


def creates_key(response: Any, world: World, role: str, row: ApiKey) -> None:
    assert response.status_code == 200
    made = ApiKey.objects.get(name="Robot")
    assert (made.classroom_id, made.created_by_id) == (world.physics.id, world.actor(role).id)
    assert new_key_in(response).startswith(f"csk-{made.prefix}-")


def revokes_key(response: Any, world: World, role: str, row: ApiKey) -> None:
    assert response.status_code == 303 and response["Location"] == keys_url(world)
    assert ApiKey.objects.get(id=row.id).revoked_at is not None


ACTIONS = {
    "page": ("get", keys_url, lists_keys),
    "create": ("post", keys_url, creates_key),
    "revoke": ("post", revoke_url, revokes_key),
}


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_what_it_may_on_the_keys_page(world: World, role: str, action: str):
    """The class's teachers and admins list, make and revoke its keys; another teacher gets
    404; students (a joined session, no login) and visitors go to the login page (after a POST,
    back to the class's page); an account that may not teach gets 403. A refusal changes
    nothing: no key made, none revoked."""
    row, _ = key_create(name="Existing", classroom=world.physics, created_by=world.lin)
    method, url, ok = ACTIONS[action]
    client = world.client(role)
    before, keys_before = snapshot(), keys_state()
    target = url(world, row) if url is revoke_url else url(world)
    response = client.get(target) if method == "get" else client.post(target, {"name": "Robot"})
    outcome = expected(role, of_class=True)
    if outcome == "ok":
        ok(response, world, role, row)
        return
    assert (snapshot(), keys_state()) == (before, keys_before)
    if outcome == "login":
        back = target if method == "get" else class_url(world)
        assert response.status_code == 302
        assert response["Location"] == f"/teach/login/?next={back}"
    elif outcome == "404":
        assert response.status_code == 404
        assert row.prefix not in response.content.decode()
    else:
        assert response.status_code == 403 and b"Teachers only" in response.content


def test_another_classes_key_is_not_found_through_ones_own_class(world: World) -> None:
    """A key of Chemistry cannot be revoked through Physics's address (404, as an unknown
    id), nor is it listed there; keys of the site (no class) are listed on no class's page."""
    theirs, _ = key_create(name="Chem bot", classroom=world.chemistry, created_by=world.mei)
    site, _ = key_create(name="Site bench", classroom=None, created_by=None)
    teacher = world.client("teacher")
    assert teacher.post(revoke_url(world, theirs)).status_code == 404
    assert teacher.post(class_url(world, "keys/not-a-uuid/revoke")).status_code == 404
    assert ApiKey.objects.get(id=theirs.id).revoked_at is None
    html = teacher.get(keys_url(world)).content.decode()
    assert theirs.prefix not in html and site.prefix not in html
    assert 'id="no-keys"' in html


def test_the_class_page_links_to_its_keys(world: World) -> None:
    html = world.client("teacher").get(class_url(world)).content.decode()
    assert f'href="{keys_url(world)}" id="class-keys"' in html


def test_the_list_tells_active_and_revoked_keys_apart(world: World) -> None:
    """Each key shows its name, public part, rate (or the site's), creator and state; only an
    active key has a revoke button."""
    active, _ = key_create(name="Active one", classroom=world.physics, created_by=world.lin, rate=7)
    gone, _ = key_create(name="Old one", classroom=world.physics, created_by=None)
    logged_in(world.lin).post(revoke_url(world, gone))
    html = world.client("teacher").get(keys_url(world)).content.decode()
    card = {
        row.prefix: html.split(f'id="key-{row.prefix}"')[1].split("</section>")[0]
        for row in (active, gone)
    }
    assert "Active one" in card[active.prefix] and "Active" in card[active.prefix]
    assert ">7<" in card[active.prefix] and "lin" in card[active.prefix]
    assert f'id="revoke-{active.prefix}"' in card[active.prefix]
    assert "Revoked" in card[gone.prefix] and "the site's (600)" in card[gone.prefix]
    assert "revoke-" not in card[gone.prefix] and "—" in card[gone.prefix]


def test_actions_need_the_csrf_token(world: World) -> None:
    """Without the form's token both POSTs are refused with 403 and change nothing."""
    row, _ = key_create(name="Existing", classroom=world.physics, created_by=world.lin)
    teacher = Client(enforce_csrf_checks=True)
    teacher.force_login(world.lin)
    before = keys_state()
    assert teacher.post(keys_url(world), {"name": "Robot"}).status_code == 403
    assert teacher.post(revoke_url(world, row)).status_code == 403
    assert keys_state() == before


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 81}, "name"),
        ({"name": "Robot", "rate": "0"}, "rate"),
        ({"name": "Robot", "rate": "31"}, "rate"),
        ({"name": "Robot", "rate": "many"}, "rate"),
    ],
    ids=["empty", "blank", "too-long", "rate-0", "rate-over", "rate-text"],
)
def test_bad_input_makes_nothing_and_says_why(
    world: World, settings: Any, form: dict[str, str], field: str
) -> None:
    """400 with the form again, the field's error and no key shown; nothing stored. The
    rate's bound follows the class bounds when the request comes (here 3 x 10 = 30)."""
    settings.CHATSITE_CLASS_BOUNDS = {**settings.CHATSITE_CLASS_BOUNDS, "CHAT_RATE_MAX": 3}
    response = world.client("teacher").post(keys_url(world), form)
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="form-errors"' in html and f'id="id_{field}_error"' in html
    assert 'id="new-key"' not in html and 'max="30"' in html
    assert ApiKey.objects.count() == 0


def test_the_highest_rate_allowed_is_accepted(world: World, settings: Any) -> None:
    settings.CHATSITE_CLASS_BOUNDS = {**settings.CHATSITE_CLASS_BOUNDS, "CHAT_RATE_MAX": 3}
    response = world.client("teacher").post(keys_url(world), {"name": "Robot", "rate": "30"})
    assert response.status_code == 200
    assert ApiKey.objects.get().rate == 30
    assert new_key_in(response)
