"""``manage.py apikey``: ``create`` prints the key alone on standard output (what it made on
standard error) and the key works on the real API; ``list`` shows every key's public part and
never a digest or a key; ``revoke`` takes a prefix (bare or as lists show it), and an unknown
one is refused with nothing changed."""

import hashlib
import io
import os
import re
import subprocess
import sys
import uuid

import httpx
import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from assistant.errors import Rejected
from assistant.models import ApiKey, Classroom
from assistant.services.api_keys import key_create, key_presented, key_read
from assistant.services.classrooms import join_code_new
from tests.support import ROOT, LiveServer, database_env

KEY = re.compile(r"csk-[a-z0-9]{10}-[A-Za-z0-9_-]{20,}")


def apikey(*args: str) -> tuple[str, str]:
    """(standard output, standard error) of ``manage.py apikey ARGS``."""
    out, err = io.StringIO(), io.StringIO()
    call_command("apikey", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def physics() -> Classroom:
    return Classroom.objects.create(name="Physics 7A", join_code=join_code_new())


def works(key: str) -> bool:
    try:
        key_read(key_presented(f"Bearer {key}"))
    except Rejected:
        return False
    return True


@pytest.mark.django_db
def test_create_prints_only_a_working_key_and_stores_its_hash() -> None:
    classroom = physics()
    out, err = apikey("create", "bench", "--class", str(classroom.id), "--rate", "7")
    key = out.strip()
    assert out == f"{key}\n" and KEY.fullmatch(key)
    row = ApiKey.objects.get()
    assert (row.name, row.classroom_id, row.rate, row.created_by) == (
        "bench",
        classroom.id,
        7,
        None,
    )
    assert row.digest == hashlib.sha256(key.encode()).hexdigest()
    assert key.startswith(f"csk-{row.prefix}-")
    assert f"csk-{row.prefix}-…" in err and "Physics 7A" in err and "never shown again" in err
    assert key not in err
    assert works(key)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", ""], "1 to 80 characters"),
        (["create", "x" * 81], "1 to 80 characters"),
        (["create", "bench", "--rate", "0"], "--rate must be at least 1"),
        (["create", "bench", "--class", str(uuid.uuid4())], "No class has the id"),
        (["create", "bench", "--class", "physics"], "invalid UUID value"),
    ],
    ids=["empty-name", "long-name", "rate-0", "unknown-class", "not-an-id"],
)
def test_create_refuses_bad_input_and_makes_nothing(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        apikey(*args)
    assert ApiKey.objects.count() == 0


@pytest.mark.django_db
def test_list_shows_each_key_and_never_a_digest_or_key() -> None:
    classroom = physics()
    site, site_key = key_create(name="site bench", classroom=None, created_by=None)
    theirs, class_key = key_create(name="lab", classroom=classroom, created_by=None, rate=12)
    apikey("revoke", site.prefix)
    out, err = apikey("list")
    lines = out.splitlines()
    assert lines[0].split() == ["PREFIX", "NAME", "CLASS", "RATE", "STATE"]
    line = {
        row.prefix: next(x for x in lines if x.startswith(row.prefix)) for row in (site, theirs)
    }
    assert "site bench" in line[site.prefix] and "(site)" in line[site.prefix]
    assert line[site.prefix].split()[-2] == "revoked"
    assert f"Physics 7A ({classroom.id})" in line[theirs.prefix]
    assert line[theirs.prefix].split()[-2:] == ["12", "active"]
    for row, key in ((site, site_key), (theirs, class_key)):
        assert row.digest not in out + err and key not in out + err


@pytest.mark.django_db
def test_revoke_by_prefix_refuses_the_key_from_then_on() -> None:
    row, key = key_create(name="bench", classroom=None, created_by=None)
    other, other_key = key_create(name="other", classroom=None, created_by=None)
    out, _ = apikey("revoke", f"csk-{row.prefix}-…")
    assert out == f"Revoked key csk-{row.prefix}-… ('bench').\n"
    assert not works(key) and works(other_key)
    revoked_at = ApiKey.objects.get(id=row.id).revoked_at
    again, _ = apikey("revoke", row.prefix)
    assert "already revoked" in again and "nothing was changed" in again
    assert ApiKey.objects.get(id=row.id).revoked_at == revoked_at
    assert ApiKey.objects.get(id=other.id).revoked_at is None


@pytest.mark.django_db
def test_an_unknown_prefix_is_refused_and_changes_nothing() -> None:
    row, _ = key_create(name="bench", classroom=None, created_by=None)
    with pytest.raises(CommandError, match="No key has the prefix 'zzzzzzzzzz'"):
        apikey("revoke", "zzzzzzzzzz")
    assert ApiKey.objects.get(id=row.id).revoked_at is None


@pytest.mark.django_db(transaction=True)
def test_a_script_keeps_the_key_from_standard_output(daphne: LiveServer) -> None:
    """As ``KEY=$(manage.py apikey create bench)`` runs it: its own process on the tests'
    database; standard output is the key alone, which the real API accepts."""
    env = {
        **os.environ,
        **database_env(connection.settings_dict["NAME"]),
        "CHATSITE_PRELOAD_ENGINE": "0",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "apikey", "create", "bench"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert done.stdout == f"{key}\n" and KEY.fullmatch(key)
    assert "Created key 'bench'" in done.stderr
    answer = httpx.get(f"{daphne.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200
