"""The rollup rows as stored, for tests that compare what ingest, the admin or prune left with
what `rebuild_rollups` computes from the rows."""

from __future__ import annotations

from pipeline.models import Rollup


def rollup_rows() -> list[tuple]:
    return sorted(Rollup.objects.values_list("kind", "grain", "bucket_start", "name", "calls", "errors", "latency",
                                             "sums"))
