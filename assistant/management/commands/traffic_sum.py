"""``manage.py traffic_sum``: sum up the last day's stream records a minute and an hour at a time
for the staff dashboard's long windows, ahead of any dashboard asking for them, and delete sums
older than two days. Run every five minutes by deploy/systemd/chatsite-traffic-sum.timer."""

from typing import Any

from django.core.management.base import BaseCommand

from assistant.services.traffic_sums import sums_ahead


class Command(BaseCommand):
    help = "Sum up the last day's stream records for the dashboard (minutes and hours)."

    def handle(self, *args: Any, **options: Any) -> None:
        spans = sums_ahead()
        self.stdout.write(f"the last day is summed up in {spans} spans")
