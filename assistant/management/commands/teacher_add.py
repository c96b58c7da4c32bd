"""``manage.py teacher_add USERNAME``: a teacher account from the command line (a server's first
teacher, or a script). Admins can do the same in the admin: a user in the "Teachers" group."""

import sys
from typing import Any, TextIO

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from assistant.services.teaching import TEACHERS_GROUP, teacher_create

#: What an existing username gets.
DUPLICATE = "A user named {username!r} already exists; nothing was changed."


class Command(BaseCommand):
    # Tests (and scripts calling call_command) hand standard input in as ``stdin``.
    stealth_options = ("stdin",)
    help = (
        f"Create a teacher account: not staff, in the {TEACHERS_GROUP!r} group, which may run "
        "classes at /teach/. In the admin, an admin does the same by adding a user to that "
        "group (Users > user > Groups). Without --password-stdin the account cannot log in "
        "until a password is set (in the admin, or with manage.py changepassword)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="", help="The teacher's email address.")
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="Read the password from the first line of standard input (not from the "
            "command line, where other users and the shell's history would see it).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username: str = options["username"]
        model = get_user_model()
        if model._default_manager.filter(**{model.USERNAME_FIELD: username}).exists():
            raise CommandError(DUPLICATE.format(username=username))
        stdin = options.get("stdin") or sys.stdin
        password = self._password(username, stdin) if options["password_stdin"] else None
        try:
            teacher_create(username=username, password=password, email=options["email"])
        except IntegrityError:
            # Created by somebody else between the check and here.
            raise CommandError(DUPLICATE.format(username=username)) from None
        self.stdout.write(f"Created teacher {username!r}.")
        if password is None:
            self.stdout.write(
                "It has no usable password: it cannot log in until one is set "
                f"(manage.py changepassword {username}, or in the admin)."
            )

    def _password(self, username: str, stdin: TextIO) -> str:
        """The first line of standard input, checked by the site's password validators."""
        password = stdin.readline().rstrip("\r\n")
        if not password:
            raise CommandError("--password-stdin: standard input held no password.")
        user = get_user_model()(username=username)
        try:
            validate_password(password, user)
        except ValidationError as error:
            raise CommandError("; ".join(error.messages)) from None
        return password
