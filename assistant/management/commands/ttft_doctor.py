"""``manage.py ttft_doctor URL [--direct URL]``: find each layer that holds a first token back.

Probes the site at ``URL`` (through its proxy) and, with ``--direct``, one worker at its own
address, with the latency probe (``/api/chat/stream/probe``: frames on a known schedule, no
model), and reports each layer with a verdict and the fix. Exits 1 when a check fails, so that
it can gate a deploy. docs/operators.md explains each check.
"""

import os
from typing import Any
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError, CommandParser

from assistant.doctor.run import (
    CHECKS,
    DoctorOptions,
    doctor_run,
    failed,
    report_json,
    report_table,
)
from assistant.models import ApiKey
from assistant.services.api_keys import key_create

KEY_VARIABLE = "CHATSITE_DOCTOR_KEY"
TEMPORARY_KEY_NAME = "ttft_doctor (temporary)"


#: Every check but the first: without the probe answering, nothing else is measured.
SKIPPABLE = CHECKS[1:]


def _checks(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SKIPPABLE]
    if unknown:
        choices = ", ".join(SKIPPABLE)
        raise CommandError(f"unknown check {', '.join(unknown)}: choose from {choices}")
    return names


def _url(text: str) -> str:
    """An http or https URL with a host, without its trailing slash."""
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise CommandError(f"{text!r} is not an http:// or https:// URL with a host name")
    return text.rstrip("/")


class Command(BaseCommand):
    help = "Probe each layer between the workers and a student for what holds tokens back."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "url", type=_url, help="The site as students reach it: https://chat.example.org"
        )
        parser.add_argument(
            "--direct",
            type=_url,
            metavar="URL",
            help="One worker's own address (http://127.0.0.1:8001), to tell the proxy's faults "
            "from the app's.",
        )
        parser.add_argument(
            "--key",
            help=f"An API key (or {KEY_VARIABLE}); without one, a temporary key is made in this "
            "site's database and deleted afterwards.",
        )
        parser.add_argument("--json", action="store_true", help="Write the report as JSON.")
        parser.add_argument(
            "--skip",
            type=_checks,
            default=[],
            metavar="CHECK[,CHECK]",
            help=f"Checks not to run: {', '.join(SKIPPABLE)}.",
        )
        parser.add_argument("--cafile", help="CA certificates to trust for an https URL.")
        parser.add_argument(
            "--insecure", action="store_true", help="Do not verify the site's certificate."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"] or os.environ.get(KEY_VARIABLE)
        temporary: ApiKey | None = None
        if not key:
            temporary, key = key_create(name=TEMPORARY_KEY_NAME, classroom=None, created_by=None)
        doctor = DoctorOptions(
            url=options["url"],
            authorization=f"Bearer {key}",
            direct=options["direct"],
            cafile=options["cafile"],
            insecure=options["insecure"],
            skip=frozenset(options["skip"]),
        )
        try:
            rows = doctor_run(doctor)
        finally:
            if temporary is not None:
                temporary.delete()
        self.stdout.write(
            report_json(doctor, rows) if options["json"] else report_table(doctor, rows)
        )
        bad = failed(rows)
        if bad:
            raise CommandError(
                f"{len(bad)} check(s) failed: {', '.join(row.id for row in bad)}", returncode=1
            )
