"""Recompute every rollup from the stored LLM and tool calls, compressions and conversations
(after a restore, a manual delete, or an upgrade that added rollups).

    manage.py rebuild_rollups
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from pipeline.rollups.compact import rebuild_rollups


class Command(BaseCommand):
    help = ("Recompute the rollups from the stored calls and conversations in one transaction; prints a "
            "one-line summary.")

    def handle(self, *args: object, **options: object) -> None:
        self.stdout.write(f"rebuild_rollups: wrote {rebuild_rollups()} rollup rows")
