"""Keep the rollups in step with the call and conversation rows, in the transaction that writes them.

Three hooks, one per kind of write, called where the rows are written:

    inserted(ToolCall, rows)                    # pipeline.ingest.write.rows.insert_rows
    with updating(ToolCall, rows, names): ...   # pipeline.ingest.write.sql.update_rows
    deleting(ToolCall, ids)                     # replaced spans, a conversation deleted
    collect_deletion(rows).delete()             # the admin and retention.prune delete rows, cascades included

and the ORM's signals for rows saved or deleted through it (the admin, retention.prune, scripts,
test fixtures). Conversations take the same hooks: inserted where ingest creates them
(pipeline.ingest.write.conversations), updating when their last activity widens, deleting when
a placeholder is folded into its named conversation or a conversation is deleted.

Only rows actually written count, so a re-sent span (stored nowhere) changes nothing; an update
takes the row's old contribution out and puts the new one in; a delete takes it out.

Inside `with batched():` (the ingest transaction: pipeline.ingest.write.store) the changes are
gathered and written once at the end of the block, still inside the transaction; elsewhere each
hook writes its own.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import orjson
from django.db import connection, transaction
from django.db.models import Model, QuerySet
from django.db.models.deletion import Collector
from django.db.models.signals import post_delete, pre_delete
from django.utils import timezone

from pipeline.conf import ctxlens_config
from pipeline.models import Conversation, Rollup
from pipeline.rollups.figures import COLUMNS, KIND_OF, Figures, add_contribution, name_and_start, values_of

GRAINS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}
Key = tuple[str, str, datetime, str]  # kind, grain, bucket_start, name
CHUNK = 500
DIGITS_AS_ZEROS = bytes.maketrans(b"123456789", b"000000000")
LONG_NUMBER = b"0" * 19  # the shortest run of digits (as zeros) that can be an integer past 64 bits


def floor(moment: datetime, grain: str) -> datetime:
    """The start of the `grain` bucket holding `moment` (UTC)."""
    moment = moment.replace(second=0, microsecond=0)
    if grain != "m":
        moment = moment.replace(minute=0)
    if grain == "d":
        moment = moment.replace(hour=0)
    return moment


def kept_since(now: datetime | None = None) -> dict[str, datetime | None]:
    """By grain, from when its rows are complete (None: always). Compaction deletes older ones."""
    config, now = ctxlens_config(), now or timezone.now()
    return {
        "m": floor(now - timedelta(hours=config.rollup_minute_hours), "h"),
        "h": floor(now - timedelta(days=config.rollup_hour_days), "d"),
        "d": None,
    }



class Deltas:
    """Changes to rollup rows, gathered and then written in one go."""

    def __init__(self) -> None:
        self.by_key: dict[Key, Figures] = defaultdict(Figures)

    def add(self, kind: str, rows: Iterable[dict[str, Any]], sign: int = 1,
            finest: Callable[[datetime], str] | None = None) -> None:
        """Gathered by minute; `expanded` adds each minute to its hour and day. With `finest`, a
        row is gathered by the finest grain still kept at its start (a rebuild keeps no minutes
        of old data, so it need not hold them): the hour or day start stands for its minute."""
        for row in rows:
            name, started = name_and_start(kind, row)
            minute = floor(started, finest(started) if finest else "m")
            add_contribution(kind, row, self.by_key[(kind, "m", minute, name)], sign)

    def expanded(self) -> dict[Key, Figures]:
        out: dict[Key, Figures] = defaultdict(Figures)
        for (kind, _, minute, name), figures in self.by_key.items():
            out[(kind, "m", minute, name)].add(figures)
            out[(kind, "h", floor(minute, "h"), name)].add(figures)
            out[(kind, "d", floor(minute, "d"), name)].add(figures)
        return out

    def write(self) -> None:
        """Write now, unless these are the open batch's deltas (written at the end of the batch)."""
        if self is not _open.deltas:
            write_deltas(self.expanded())


def _deltas() -> Deltas:
    """The open batch's deltas, or new ones to write at once."""
    return _open.deltas if _open.deltas is not None else Deltas()


class _Open(threading.local):
    deltas: Deltas | None = None


_open = _Open()


@contextmanager
def batched() -> Iterator[None]:
    """Gather the hooks' changes and write them once, at the end of the block (not on an error)."""
    if _open.deltas is not None:  # nested: the outer block writes
        yield
        return
    _open.deltas = Deltas()
    try:
        yield
        deltas, _open.deltas = _open.deltas, None
        write_deltas(deltas.expanded())
    finally:
        _open.deltas = None


def write_deltas(by_key: dict[Key, Figures]) -> None:
    """Add each delta to its rollup row: create it, update it, or delete it when no call is left.
    Rows of a grain older than it is kept (`kept_since`: compaction's age) are left alone, as a
    rebuild has none and no read takes them: a call that started days ago adds to its day only."""
    since = kept_since()
    changed = {k: d for k, d in by_key.items() if (d.calls or d.sums or d.errors or d.latency)
               and (since[k[1]] is None or k[2] >= since[k[1]])}
    if not changed:
        return
    # Ingest calls this inside its transaction; an ORM save outside one (admin, scripts) gets its
    # own here, which SELECT … FOR UPDATE needs on PostgreSQL.
    with transaction.atomic(savepoint=False):
        _write_changed(changed)


def _locked_rows(keys: Sequence[Key]) -> dict[Key, tuple]:
    """The stored rows of `keys`, locked (FOR UPDATE on PostgreSQL, so that two batches adding to
    a bucket take turns), in id order: the keys are a VALUES list joined on the unique index, one
    probe per key (a filter by each column's values would read every combination of them, a few
    hundred rows with their JSON for the thirty keys of an ingest batch)."""
    found: dict[Key, tuple] = {}
    wanted = sorted(set(keys))
    table, quote = connection.ops.quote_name(Rollup._meta.db_table), connection.ops.quote_name
    lock = " FOR UPDATE OF r" if connection.features.has_select_for_update else ""
    adapt = connection.ops.adapt_datetimefield_value
    for i in range(0, len(wanted), CHUNK):
        chunk = wanted[i:i + CHUNK]
        params = [value for n, (kind, grain, start, name) in enumerate(chunk)
                  for value in (n, kind, grain, adapt(start), name)]
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT v.column1, r.id, r.calls, r.sums, r.errors, r.latency "
                f"FROM (VALUES {', '.join(['(%s, %s, %s, %s, %s)'] * len(chunk))}) AS v JOIN {table} r "
                f"ON r.kind = v.column2 AND r.grain = v.column3 AND r.{quote('bucket_start')} = v.column4 "
                f"AND r.name = v.column5 ORDER BY r.id{lock}", params)
            for n, pk, calls, *figures in cursor.fetchall():
                found[chunk[n]] = (pk, calls, *map(_loads, figures))
    return found


def _loads(value: Any) -> Any:
    """A JSON column as JSONField reads it (json.loads of the text both engines return here), with
    orjson where it reads the same: not for NaN or Infinity (orjson refuses them) nor for integers
    past 64 bits (orjson reads them as floats; any run of 19 digits goes to json.loads)."""
    if not isinstance(value, str):
        return value
    text = value.encode()
    if LONG_NUMBER not in text.translate(DIGITS_AS_ZEROS):  # a regex search would cost more than orjson
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(value)


def _sqlite_json(value: dict[str, Any]) -> str:
    """The JSON text of a rollup column, read back by json.loads (JSONField) as json.dumps's is:
    orjson's, 5-10x faster, unless it refuses the value (keys that are not strings, integers past
    64 bits, lone surrogates) or writes NaN or Infinity as null (no rollup value is ever None); then
    json.dumps's, as JSONField would write it."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value)
    return json.dumps(value) if b"null" in text else text.decode()


def _write_changed(changed: dict[Key, Figures]) -> None:
    existing = _locked_rows(list(changed))
    missing = [key for key in sorted(changed) if key not in existing]
    if missing:
        # FOR UPDATE has no row to lock for a new bucket, so two writers could both create it (and
        # the loser's whole batch would fail on the unique index): insert it empty, where the
        # second insert does nothing, then lock it like the others.
        Rollup.objects.bulk_create([Rollup(kind=kind, grain=grain, bucket_start=start, name=name)
                                    for kind, grain, start, name in missing], batch_size=CHUNK, ignore_conflicts=True)
        existing.update(_locked_rows(missing))
    new, updated, emptied = [], [], []
    # what JSONField writes: the backend's adapter, or on SQLite the same text for json.loads to read
    encode = _sqlite_json if connection.vendor == "sqlite" else partial(connection.ops.adapt_json_value, encoder=None)
    for key in sorted(changed):
        row = existing.get(key)
        figures = Figures() if row is None else Figures.from_stored(*row[1:])
        figures.add(changed[key])
        if figures.calls <= 0:
            if row is not None:
                emptied.append(row[0])
            continue
        stored = figures.stored()
        if row is None:
            kind, grain, start, name = key
            new.append(Rollup(kind=kind, grain=grain, bucket_start=start, name=name, **stored))
        else:
            updated.append((stored["calls"], encode(stored["sums"]), encode(stored["errors"]),
                            encode(stored["latency"]), row[0]))
    if emptied:
        Rollup.objects.filter(pk__in=emptied).delete()
    if updated:  # one executemany: bulk_update's CASE WHEN costs more than the rest of this put together
        query = (f"UPDATE {Rollup._meta.db_table} SET calls = %s, sums = %s, errors = %s, latency = %s "
                 f"WHERE id = %s")
        with connection.cursor() as cursor:
            cursor.executemany(query, updated)
    if new:
        Rollup.objects.bulk_create(new, batch_size=CHUNK)


def _stored_values_by_id(model: type[Model], ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """{id: {column: value}} of COLUMNS[kind], as `.values()` gives them: a raw SELECT with the
    ORM's own converters (booleans, decimals, datetimes, JSON), because this runs for every
    update ingest makes and the ORM spent more compiling the query than SQLite running it."""
    names = COLUMNS[KIND_OF[model]]
    columns = [model._meta.get_field(name).get_col(model._meta.db_table) for name in names]
    converters = [(i, column, found) for i, column in enumerate(columns)
                  if (found := [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)])]
    quote = connection.ops.quote_name
    selected = ", ".join(quote(column.target.column) for column in columns)
    out: dict[int, dict[str, Any]] = {}
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i:i + CHUNK]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {quote(model._meta.pk.column)}, {selected} FROM {quote(model._meta.db_table)} "
                           f"WHERE {quote(model._meta.pk.column)} IN ({', '.join(['%s'] * len(chunk))})", chunk)
            for pk, *values in cursor.fetchall():
                for n, column, found in converters:
                    for convert in found:
                        values[n] = convert(values[n], column, connection)
                out[pk] = dict(zip(names, values))
    return out


def inserted(model: type[Model], rows: Sequence[Model]) -> None:
    """Count rows just inserted (their instances hold what was written)."""
    if model in KIND_OF and rows:
        kind = KIND_OF[model]
        deltas = _deltas()
        deltas.add(kind, (values_of(kind, row) for row in rows))
        deltas.write()


def deleting(model: type[Model], ids: Sequence[int]) -> None:
    """Take out rows about to be deleted (call before the delete, in its transaction)."""
    _add_stored(model, ids, sign=-1)


def rows_to_delete(queryset: QuerySet, *also: str) -> QuerySet:
    """`queryset` reading the primary key and the fields `also` alone when nothing listens for its
    model's deletes, as Django reads the rows a delete cascades to: the cascade goes by primary key,
    and an LLM call's messages (megabytes, perhaps) are not read to be deleted."""
    model = queryset.model
    if pre_delete.has_listeners(model) or post_delete.has_listeners(model):
        return queryset
    return queryset.only("pk", *also)


def collect_deletion(objs: Iterable[Model]) -> Collector:
    """Django's Collector for a delete of `objs` (rows, or a queryset of them), with every call it will remove,
    cascade included, taken out of the rollups: the caller deletes with it (`collector.delete()`),
    in the same transaction, so what leaves the rollups is what is deleted. Not for conversations:
    they leave through their pre_delete hook, which takes their calls out itself."""
    collector = Collector(using=connection.alias)
    # a queryset as it is: rows nothing cascades from (spans, log records) go in one DELETE unread
    collector.collect(objs.order_by() if isinstance(objs, QuerySet) else list(objs))  # as QuerySet.delete does
    if Conversation in collector.data:
        raise ValueError("conversations are deleted with Model.delete(): their pre_delete hook keeps the rollups")
    for model, pks in collected_ids(collector, KIND_OF).items():
        deleting(model, sorted(pks))
    return collector


def collected_ids(collector: Collector, models: Container[type[Model]] | None = None) -> dict[type[Model], set[Any]]:
    """The primary keys of the rows a collected delete removes, by model (those of `models` only,
    when given: the others' fast deletes are not read): the rows it holds, and those its fast deletes
    name, read by id, unordered (a model's ordering would scan its index). A row two fast deletes
    name (a round's tool calls are its conversation's too) is there once."""
    ids: dict[type[Model], set[Any]] = defaultdict(set)
    for model, instances in collector.data.items():
        if models is None or model in models:
            ids[model].update(instance.pk for instance in instances)
    for queryset in collector.fast_deletes:
        if models is None or queryset.model in models:
            ids[queryset.model].update(queryset.order_by().values_list("pk", flat=True))
    return ids


def _add_stored(model: type[Model], ids: Sequence[int], sign: int) -> None:
    """Add (or take out) the rows of `ids` as they are stored."""
    if model in KIND_OF and ids:
        deltas = _deltas()
        deltas.add(KIND_OF[model], _stored_values_by_id(model, list(ids)).values(), sign=sign)
        deltas.write()


@contextmanager
def updating(model: type[Model], rows: Sequence[Model], names: Sequence[str]) -> Iterator[None]:
    """Around an UPDATE of `names` on `rows`: take their old contribution out and put the new one in."""
    kind = KIND_OF.get(model)
    tracked = kind is not None and rows and any(name in COLUMNS[kind] for name in names)
    if not tracked:
        yield
        return
    ids = [row.pk for row in rows]
    old = _stored_values_by_id(model, ids)
    yield
    # the new values: the stored ones with the columns just written taken from the instances
    written = [name for name in COLUMNS[kind] if name in names]
    new = [{**old[row.pk], **{name: getattr(row, name) for name in written}} for row in rows if row.pk in old]
    deltas = _deltas()
    deltas.add(kind, old.values(), sign=-1)
    deltas.add(kind, new)
    deltas.write()


def on_conversation_delete(sender: type[Model], instance: Model, **kwargs: Any) -> None:
    """A conversation deleted (the admin; prune's last step): it leaves its count, and its rows leave
    with the cascade."""
    deleting(sender, [instance.pk])
    for model in KIND_OF:
        if model is not sender:
            deleting(model, list(model.objects.filter(conversation_id=instance.pk).values_list("pk", flat=True)))


def on_pre_save(sender: type[Model], instance: Model, raw: bool = False, **kwargs: Any) -> None:
    """A call or conversation saved through the ORM (the admin, scripts, fixtures): take its stored
    version out."""
    if not raw and instance.pk is not None and not instance._state.adding:
        deleting(sender, [instance.pk])


def on_post_save(sender: type[Model], instance: Model, raw: bool = False, **kwargs: Any) -> None:
    """...and put the stored version in, read back: `save(update_fields=…)` writes only some of
    the instance's values. Ingest writes with SQL (the hooks above), not through here."""
    if not raw and instance.pk is not None:
        _add_stored(sender, [instance.pk], sign=1)
