"""``manage.py prune [--days N] [--dry-run]``: delete measurements older than the retention
(``CHATSITE_RECORDS_KEEP_DAYS``, 365; 0 keeps them all) and expired sessions. Run daily by
deploy/systemd/chatsite-prune.timer."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from assistant.services.retention import records_prune


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise CommandError(f"--days takes a whole number of days, not {text!r}") from None
    if days < 1:
        raise CommandError("--days must be at least 1")
    return days


class Command(BaseCommand):
    help = "Delete stream records and breaker events older than the retention, and old sessions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days", type=_days, help="Keep this many days (default CHATSITE_RECORDS_KEEP_DAYS)."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would go, delete nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        pruned = records_prune(days=options["days"], dry_run=options["dry_run"])
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(
            f"{verb} {pruned.records} stream records and {pruned.breaker_events} breaker events "
            f"from before {pruned.before:%Y-%m-%d %H:%M %Z}"
            + ("; expired sessions cleared" if pruned.sessions_cleared else "")
        )
