"""Rollups: per tool, per model and per compression strategy, what their calls (or
compressions) added up to in one time bucket.

Kept at ingest in the transaction that writes the calls (pipeline.rollups), so windowed
statistics read a few rows per bucket instead of every call. One row per (kind, name, grain,
bucket): kind "tool" (name = tool name), "model" (name = LLM call model), "compression" (name =
strategy) or "conversation" (name "", `calls` = conversations last active in it); grain "m", "h" or
"d" (a minute, an hour, a day, UTC) starting at `bucket_start`. Every call counts in all three
grains; `compact_rollups` deletes minute rows older than CTXLENS_ROLLUP_MINUTE_HOURS and hour
rows older than CTXLENS_ROLLUP_HOUR_DAYS, so old data is read by the hour or the day.
"""

from __future__ import annotations

from django.db import models


class Rollup(models.Model):
    kind = models.CharField(max_length=16)  # "tool" | "model" | "compression" | "conversation"
    name = models.CharField(max_length=255)
    grain = models.CharField(max_length=1)  # "m" | "h" | "d"
    bucket_start = models.DateTimeField()
    calls = models.BigIntegerField(default=0)
    # Sums by field (integers; "duration_ms" a float; costs as decimal strings): pipeline.rollups.sums
    sums = models.JSONField(default=dict)
    errors = models.JSONField(default=dict)  # error type -> failed calls
    latency = models.JSONField(default=dict)  # sketch bucket -> calls (pipeline.rollups.sketch)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "grain", "bucket_start", "name"], name="rollup_unique_bucket")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} {self.grain} {self.bucket_start:%Y-%m-%d %H:%M}"
