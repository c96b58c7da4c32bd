"""``manage.py apikey create|revoke|list``: API keys for the OpenAI-compatible API (``/v1/``) from
the command line (a benchmark's key, a server's first tool). Admins do the same in the admin
(Assistant > API keys), teachers on their class's keys page (``/teach/<class id>/keys``).

``create`` prints the key alone on standard output, so a script can keep it
(``KEY=$(manage.py apikey create bench)``), and what it made on standard error. The key is
shown that once: only its hash is stored (``services/api_keys.py``). Nothing here prints a
digest.
"""

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from assistant.models import ApiKey, Classroom
from assistant.services.api_key_access import key_by_prefix, key_shown, keys_listed
from assistant.services.api_keys import key_create, key_revoke

#: The longest name a key may have (``ApiKey.name``).
NAME_MAX_CHARS = 80
#: What an unknown prefix gets.
UNKNOWN = "No key has the prefix {prefix!r}; nothing was changed."


def _plain(text: str) -> str:
    """Standard error's details, uncoloured (Django colours standard error as errors)."""
    return text


class Command(BaseCommand):
    help = (
        "Create, revoke or list API keys for the OpenAI-compatible API (/v1/). "
        "'create NAME [--class CLASS_ID] [--rate N]' prints the new key (only it) on standard "
        "output: it is never shown again. 'revoke PREFIX' refuses the key from its next "
        "request on. 'list' shows every key's prefix, name, class, rate and state."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = actions.add_parser("create", help="Create a key and print it.")
        create.add_argument("name", help="What the key is for (at most 80 characters).")
        create.add_argument(
            "--class",
            dest="classroom",
            type=uuid.UUID,
            default=None,
            metavar="CLASS_ID",
            help="The class it answers for (its persona and settings); default: the site.",
        )
        create.add_argument(
            "--rate",
            type=int,
            default=None,
            help="Requests per minute; default: the site's (CHATSITE_API_RATE).",
        )
        revoke = actions.add_parser("revoke", help="Revoke a key by its prefix.")
        revoke.add_argument("prefix", help="The key's prefix, as 'list' shows it.")
        actions.add_parser("list", help="List every key (never its secret or hash).")

    def handle(self, *args: Any, **options: Any) -> None:
        action: str = options["action"]
        if action == "create":
            self._create(options["name"], options["classroom"], options["rate"])
        elif action == "revoke":
            self._revoke(options["prefix"])
        else:
            self._list()

    def _create(self, name: str, classroom_id: uuid.UUID | None, rate: int | None) -> None:
        name = name.strip()
        if not name or len(name) > NAME_MAX_CHARS:
            raise CommandError(f"A key's name takes 1 to {NAME_MAX_CHARS} characters.")
        if rate is not None and rate < 1:
            raise CommandError("--rate must be at least 1 (revoke a key to stop it).")
        classroom = None
        if classroom_id is not None:
            classroom = Classroom.objects.filter(id=classroom_id).first()
            if classroom is None:
                raise CommandError(f"No class has the id {classroom_id}; no key was made.")
        row, key = key_create(name=name, classroom=classroom, created_by=None, rate=rate)
        self.stdout.write(key)
        whose = f"class {classroom.name!r} ({classroom.id})" if classroom else "the site"
        self.stderr.write(
            f"Created key {row.name!r} ({key_shown(row)}) for {whose}, "
            f"{_rate(row)}. It is printed once and never shown again.",
            style_func=_plain,
        )

    def _revoke(self, prefix: str) -> None:
        try:
            row = key_by_prefix(prefix)
        except ApiKey.DoesNotExist:
            raise CommandError(UNKNOWN.format(prefix=prefix)) from None
        if row.revoked_at is not None:
            self.stdout.write(
                f"Key {key_shown(row)} ({row.name!r}) was already revoked on "
                f"{row.revoked_at:%Y-%m-%d %H:%M %Z}; nothing was changed."
            )
            return
        key_revoke(row)
        self.stdout.write(f"Revoked key {key_shown(row)} ({row.name!r}).")

    def _list(self) -> None:
        rows = [
            (
                row.prefix,
                row.name,
                f"{row.classroom.name} ({row.classroom_id})" if row.classroom else "(site)",
                str(row.rate) if row.rate is not None else "site",
                f"revoked {row.revoked_at:%Y-%m-%d}" if row.revoked_at else "active",
            )
            for row in keys_listed()
        ]
        header = ("PREFIX", "NAME", "CLASS", "RATE", "STATE")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for line in [header, *rows]:
            self.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            )


def _rate(row: ApiKey) -> str:
    return f"{row.rate} requests a minute" if row.rate is not None else "the site's rate"
