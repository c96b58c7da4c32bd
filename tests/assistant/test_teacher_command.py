"""``manage.py teacher_add``: a teacher account (not staff, in the Teachers group, allowed to run
classes), with a password from standard input or none until one is set; an existing username is
refused and left as it was."""

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from assistant.services.teaching import TEACH_PERMISSION, TEACHERS_GROUP
from tests.support import database_env

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pw-long-enough-123"
User = get_user_model()


def teacher_add(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    options: dict[str, Any] = {"stdout": out}
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command("teacher_add", *args, **options)
    return out.getvalue()


@pytest.mark.django_db
def test_a_teacher_without_a_password_cannot_log_in_until_one_is_set() -> None:
    out = teacher_add("wang.li", "--email", "wang.li@school.example")
    user = User.objects.get(username="wang.li")
    assert user.is_staff is False and user.is_superuser is False
    assert list(user.groups.values_list("name", flat=True)) == [TEACHERS_GROUP]
    assert user.has_perm(TEACH_PERMISSION)
    assert user.email == "wang.li@school.example"
    assert user.has_usable_password() is False
    assert "Created teacher 'wang.li'." in out
    assert "It has no usable password: it cannot log in until one is set" in out


@pytest.mark.django_db
def test_a_password_from_standard_input_logs_in_at_the_teachers_login() -> None:
    out = teacher_add("zhao", "--password-stdin", stdin=f"{PASSWORD}\n")
    assert "no usable password" not in out
    browser = Client()
    response = browser.post("/teach/login/", {"username": "zhao", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/teach/"
    assert browser.get("/teach/").status_code == 200


@pytest.mark.django_db
def test_an_existing_username_is_refused_and_left_alone() -> None:
    existing = User.objects.create_user("chen", email="old@school.example", password=PASSWORD)
    with pytest.raises(CommandError, match="A user named 'chen' already exists"):
        teacher_add("chen", "--email", "new@school.example")
    again = User.objects.get(username="chen")
    assert User.objects.filter(username="chen").count() == 1
    assert (again.email, again.password) == ("old@school.example", existing.password)
    assert again.groups.count() == 0 and again.has_perm(TEACH_PERMISSION) is False


@pytest.mark.django_db
def test_an_empty_standard_input_creates_nobody() -> None:
    with pytest.raises(CommandError, match="standard input held no password"):
        teacher_add("liu", "--password-stdin", stdin="")
    assert not User.objects.filter(username="liu").exists()


@pytest.mark.django_db(transaction=True)
def test_the_command_line_reads_the_password_from_a_pipe() -> None:
    """As an admin runs it: a process of its own, on the tests' database, the password piped in;
    the same name again exits 1 with the reason on standard error."""
    env = {
        **os.environ,
        **database_env(connection.settings_dict["NAME"]),
        "CHATSITE_PRELOAD_ENGINE": "0",
    }
    command = [sys.executable, "manage.py", "teacher_add", "sun", "--password-stdin"]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, input=f"{PASSWORD}\n", env=env, cwd=ROOT, capture_output=True, text=True
        )

    first = run()
    assert first.returncode == 0, first.stderr
    assert User.objects.get(username="sun").check_password(PASSWORD)
    second = run()
    assert second.returncode == 1
    assert "A user named 'sun' already exists; nothing was changed." in second.stderr
