"""Delete minute and hour rollups past their age (prune runs it too; cron it hourly if you like).

    manage.py compact_rollups
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from pipeline.conf import ctxlens_config
from pipeline.rollups.compact import compact_rollups


class Command(BaseCommand):
    help = ("Delete minute rollups older than CTXLENS_ROLLUP_MINUTE_HOURS and hour rollups older than "
            "CTXLENS_ROLLUP_HOUR_DAYS; prints a one-line summary.")

    def handle(self, *args: object, **options: object) -> None:
        deleted = compact_rollups()
        config = ctxlens_config()
        self.stdout.write(f"compact_rollups: deleted {deleted} rollup rows (minutes older than "
                          f"{config.rollup_minute_hours} h, hours older than {config.rollup_hour_days} d)")
