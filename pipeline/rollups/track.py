"""Keep the rollups in step with the call rows, in the transaction that writes them.

Three hooks, one per kind of write, called where the rows are written:

    inserted(ToolCall, rows)                    # pipeline.ingest.write.rows.insert_rows
    with updating(ToolCall, rows, names): ...   # pipeline.ingest.write.sql.update_rows
    deleting(ToolCall, ids)                     # replaced spans, retention.prune

Only rows actually written count, so a re-sent span (stored nowhere) changes nothing; an update
takes the row's old contribution out and puts the new one in; a delete takes it out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Model

from pipeline.models import Rollup
from pipeline.rollups.figures import COLUMNS, KIND_OF, Figures, contribution, values_of

GRAINS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}
Key = tuple[str, str, datetime, str]  # kind, grain, bucket_start, name
CHUNK = 500


def floor(moment: datetime, grain: str) -> datetime:
    """The start of the `grain` bucket holding `moment` (UTC)."""
    moment = moment.replace(second=0, microsecond=0)
    if grain != "m":
        moment = moment.replace(minute=0)
    if grain == "d":
        moment = moment.replace(hour=0)
    return moment


class Deltas:
    """Changes to rollup rows, gathered and then written in one go."""

    def __init__(self) -> None:
        self.by_key: dict[Key, Figures] = defaultdict(Figures)

    def add(self, kind: str, rows: Iterable[dict[str, Any]], sign: int = 1) -> None:
        for row in rows:
            name, started, figures = contribution(kind, row)
            for grain in GRAINS:
                self.by_key[(kind, grain, floor(started, grain), name)].add(figures, sign)

    def write(self) -> None:
        write_deltas(self.by_key)


def write_deltas(by_key: dict[Key, Figures]) -> None:
    """Add each delta to its rollup row: create it, update it, or delete it when no call is left."""
    changed = {k: d for k, d in by_key.items() if d.calls or d.sums or d.errors or d.latency}
    if not changed:
        return
    wanted = defaultdict(set)
    for kind, grain, start, name in changed:
        wanted[(kind, grain)].add(start)
    existing: dict[Key, Rollup] = {}
    for (kind, grain), starts in wanted.items():
        names = sorted({k[3] for k in changed if k[0] == kind and k[1] == grain})
        starts = sorted(starts)
        for i in range(0, len(starts), CHUNK):
            # FOR UPDATE on PostgreSQL: two batches adding to one bucket take turns
            rows = (Rollup.objects.select_for_update().order_by("pk")
                    .filter(kind=kind, grain=grain, bucket_start__in=starts[i:i + CHUNK], name__in=names))
            for row in rows:
                existing[(row.kind, row.grain, row.bucket_start, row.name)] = row
    new, updated, emptied = [], [], []
    for key in sorted(changed):
        row = existing.get(key)
        figures = Figures() if row is None else Figures.from_stored(row.calls, row.sums, row.errors, row.latency)
        figures.add(changed[key])
        if figures.calls <= 0:
            if row is not None:
                emptied.append(row.pk)
            continue
        stored = figures.stored()
        if row is None:
            kind, grain, start, name = key
            new.append(Rollup(kind=kind, grain=grain, bucket_start=start, name=name, **stored))
        else:
            for attr, value in stored.items():
                setattr(row, attr, value)
            updated.append(row)
    if emptied:
        Rollup.objects.filter(pk__in=emptied).delete()
    if updated:
        Rollup.objects.bulk_update(updated, ["calls", "sums", "errors", "latency"], batch_size=CHUNK)
    if new:
        Rollup.objects.bulk_create(new, batch_size=CHUNK)


def _stored_values(model: type[Model], ids: Sequence[int]) -> list[dict[str, Any]]:
    kind = KIND_OF[model]
    out: list[dict[str, Any]] = []
    for i in range(0, len(ids), CHUNK):
        out.extend(model.objects.order_by().filter(pk__in=ids[i:i + CHUNK]).values(*COLUMNS[kind]))
    return out


def inserted(model: type[Model], rows: Sequence[Model]) -> None:
    """Count rows just inserted (their instances hold what was written)."""
    if model in KIND_OF and rows:
        kind = KIND_OF[model]
        deltas = Deltas()
        deltas.add(kind, (values_of(kind, row) for row in rows))
        deltas.write()


def deleting(model: type[Model], ids: Sequence[int]) -> None:
    """Take out rows about to be deleted (call before the delete, in its transaction)."""
    if model in KIND_OF and ids:
        deltas = Deltas()
        deltas.add(KIND_OF[model], _stored_values(model, list(ids)), sign=-1)
        deltas.write()


@contextmanager
def updating(model: type[Model], rows: Sequence[Model], names: Sequence[str]) -> Iterator[None]:
    """Around an UPDATE of `names` on `rows`: take their old contribution out and put the new one in."""
    kind = KIND_OF.get(model)
    tracked = kind is not None and rows and any(
        name in COLUMNS[kind] or f"{name}_id" in COLUMNS[kind] for name in names
    )
    if not tracked:
        yield
        return
    ids = [row.pk for row in rows]
    deltas = Deltas()
    deltas.add(kind, _stored_values(model, ids), sign=-1)
    yield
    deltas.add(kind, _stored_values(model, ids))
    deltas.write()


def on_pre_save(sender: type[Model], instance: Model, raw: bool = False, **kwargs: Any) -> None:
    """A call saved through the ORM (the admin, scripts, fixtures): take its stored version out."""
    if not raw and instance.pk is not None and not instance._state.adding:
        deleting(sender, [instance.pk])


def on_post_save(sender: type[Model], instance: Model, raw: bool = False, **kwargs: Any) -> None:
    """...and put the saved version in. Ingest writes with SQL (the hooks above), not through here."""
    if not raw:
        inserted(sender, [instance])
