"""Delete conversations, spans and artifacts older than the retention period (cron it daily).

    manage.py prune [--days N] [--dry-run] [--batch-size 1000]
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pipeline.conf import ctxlens_config
from pipeline.retention import BATCH_SIZE, prune


class Command(BaseCommand):
    help = "Delete what is older than CTXLENS_RETENTION_DAYS in short batches; prints a one-line summary."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, help="keep this many days instead of CTXLENS_RETENTION_DAYS")
        parser.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
        parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="rows per transaction")

    def handle(self, *args: object, **options: object) -> None:
        days = options["days"] if options["days"] is not None else ctxlens_config().retention_days
        if int(days) < 1:  # type: ignore[arg-type]
            raise CommandError("--days must be at least 1")
        if int(options["batch_size"]) < 1:  # type: ignore[arg-type]
            raise CommandError("--batch-size must be at least 1")
        result = prune(int(days), dry_run=bool(options["dry_run"]), batch_size=int(options["batch_size"]))  # type: ignore[arg-type]
        self.stdout.write(result.summary())
