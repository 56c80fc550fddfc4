"""Apply artifact retention: `python manage.py cleanup_artifacts [--dry-run]`, from cron or a systemd timer."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser

from pipeline.artifacts.cleanup import cleanup_artifacts


class Command(BaseCommand):
    help = (
        "Delete expired artifacts (CTXLENS_ARTIFACT_TTL_HOURS), evict the least recently used until the "
        "total fits CTXLENS_ARTIFACT_MAX_TOTAL_BYTES, and remove orphan files; prints one summary line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Report what would be removed; change nothing.")
        parser.add_argument(
            "--max-total-bytes", type=int, default=None, help="Size cap for this run (default: the setting)."
        )

    def handle(self, *args: object, dry_run: bool = False, max_total_bytes: int | None = None, **options: object) -> None:
        report = cleanup_artifacts(dry_run=dry_run, max_total_bytes=max_total_bytes)
        self.stdout.write(report.line())
