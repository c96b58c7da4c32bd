"""Empty PROMETHEUS_MULTIPROC_DIR before the workers start.

With several Daphne workers, prometheus_client keeps each process's values in files in that
directory, and /metrics on any worker adds them all up. Files left by an earlier run would be
added too (counters would not restart at zero, dead workers' gauges would linger), so the
directory is emptied once, before any worker starts: never from a worker itself.
"""

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Empty PROMETHEUS_MULTIPROC_DIR (run once, before starting the workers)."

    def handle(self, *args: Any, **options: Any) -> None:
        value = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not value:
            raise CommandError("PROMETHEUS_MULTIPROC_DIR is not set: nothing to reset.")
        directory = Path(value)
        directory.mkdir(parents=True, exist_ok=True)
        removed = 0
        for entry in directory.glob("*.db"):
            entry.unlink()
            removed += 1
        self.stdout.write(f"Emptied {directory} ({removed} files).")
