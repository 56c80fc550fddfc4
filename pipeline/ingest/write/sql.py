"""Bulk reads and writes for the ingest hot path, in portable SQL (SQLite and PostgreSQL).

Measured on an ingest batch of 100 spans, the ORM's per-query Python (0.3–0.5 ms a query),
bulk_create's value preparation and bulk_update's CASE WHEN expressions cost more than the
database work itself. This module sends hand-written statements instead: one parameterised
INSERT or UPDATE run with executemany (on PostgreSQL with the values bound on the server:
`executemany`), and SELECTs whose rows become model instances through
`Model.from_db`. Values are prepared as the fields would prepare them (JSON through the
backend's JSON adapter, datetimes through its datetime adapter), so everything reads back
through the ORM exactly as if the ORM had written it.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

import orjson
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections
from django.db.models import NOT_PROVIDED, DateTimeField, JSONField, Model
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init
from django.utils.dateparse import parse_datetime

from pipeline.ingest.write.sanitise import integer_clamp
from pipeline.rollups import track as rollups

ZERO = timedelta(0)
# orjson writes datetimes and dataclasses, which json.dumps (JSONField's encoder) refuses: passed
# through, they are refused by orjson too and go to json.dumps, so what is stored is what the ORM
# would store, refusals included. (UUIDs and plain Enums orjson still writes, having no option to
# pass them through; the values ingest writes are decoded from JSON or protobuf and hold neither.)
ORJSON_AS_JSON = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


_quoted: dict[str, str] = {}


def quote(name: str) -> str:
    """The backend's quoting of a table or column name, remembered: every statement here names a
    dozen columns, and each `connection` attribute access is a thread-local lookup. (SQLite and
    PostgreSQL quote alike, and a process has one default database.)"""
    quoted = _quoted.get(name)
    if quoted is None:
        quoted = _quoted[name] = connection.ops.quote_name(name)
    return quoted


def table(model: type[Model]) -> str:
    return quote(model._meta.db_table)


def columns(names: Iterable[str]) -> str:
    return ", ".join(quote(n) for n in names)


def marks(values: Sequence[Any]) -> str:
    """`%s, %s, ...` for an IN list of `values` (never empty: IN () is not valid SQL)."""
    return ", ".join(["%s"] * len(values)) if values else "NULL"


# Rows found by two IN lists at once (conversation and key, trace and span) are looked up this
# many at a time: the database probes every pair of the two lists, so one query for n rows does
# n² probes (measured on SQLite: 10,000 rounds in one query took 10 s, in chunks of 200 0.2 s).
PAIR_CHUNK = 200


def chunked(values: Sequence[Any], size: int = PAIR_CHUNK) -> Iterable[Sequence[Any]]:
    return (values[i:i + size] for i in range(0, len(values), size))


# Rows found by their (trace_id, span_id) go this many pairs to a query.
SPAN_CHUNK = 500


def by_spans(model: type[Model], names: Sequence[str], keys: Iterable[tuple[str, str]]) -> list[tuple]:
    """(trace_id, span_id, *names) of the rows of `model` whose (trace_id, span_id) is in `keys`.

    The pairs are a VALUES list joined on the unique (trace_id, span_id) index: one index probe
    per pair, whatever else the traces hold (two IN lists would probe every pair of them, and a
    lookup by trace alone reads the whole trace).
    """
    keys, rows = sorted(set(keys)), []
    selected = "".join(f", x.{quote(n)}" for n in names)
    for chunk in chunked(keys, SPAN_CHUNK):
        values = ", ".join(["(%s, %s)"] * len(chunk))
        rows += fetch(
            f"SELECT x.trace_id, x.span_id{selected} FROM (VALUES {values}) AS v "
            f"JOIN {table(model)} x ON x.trace_id = v.column1 AND x.span_id = v.column2",
            [value for key in chunk for value in key],
        )
    return rows


_shared = threading.local()


@contextmanager
def shared_cursor() -> Iterator[None]:
    """The statements this module sends inside the block share one cursor of this thread's
    connection: opening a Django cursor costs more than running a short statement (measured
    ~12 µs of ~21 for `SELECT 1`), and an ingest transaction runs dozens of them. Every
    statement's rows are read in full before the next is sent, so sharing is safe. (On
    PostgreSQL, `executemany` opens a cursor of its own, a few per transaction.)"""
    if getattr(_shared, "cursor", None) is not None:
        yield
        return
    with connection.cursor() as shared:
        _shared.cursor = shared
        try:
            yield
        finally:
            _shared.cursor = None


def cursor() -> AbstractContextManager:
    """The block's shared cursor (`shared_cursor`), else a cursor of its own."""
    shared = getattr(_shared, "cursor", None)
    return nullcontext(shared) if shared is not None else connection.cursor()


def executemany(query: str, rows: Sequence[Sequence[Any]]) -> None:
    """One statement run for each of `rows`. On PostgreSQL the rows' values are bound on the server
    (`_server_binding_cursor`): the INSERTs and UPDATEs of ingest carry kilobytes of trace text a
    row, which Django's default cursor would escape into the statement's text, for PostgreSQL to
    scan again as literals, row after row (what that saves: README, Deployment). A row's handful
    of values stays far below the 65,535 parameters a server-bound statement may carry, which a
    long IN list elsewhere could pass: those keep Django's cursor."""
    if connection.vendor != "postgresql":
        with cursor() as c:
            c.executemany(query, rows)
        return
    with _server_binding_cursor() as c:
        c.executemany(query, rows)


def _server_binding_cursor() -> AbstractContextManager:
    """A cursor of this thread's PostgreSQL connection that sends the parameters apart from the
    statement (Django's ServerBindingCursor, what its `server_side_binding` option makes every
    cursor; its default, a ClientCursor, writes them into the text), set up and wrapped as
    `connection.cursor()` does: the health check, database errors translated, statements logged
    when queries are (assertNumQueries, DEBUG). Not its time-zone loader for the rows read: these
    statements read none."""
    from django.db.backends.postgresql.base import ServerBindingCursor  # needs psycopg: PostgreSQL only

    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        raw = ServerBindingCursor(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


def fetch(query: str, params: Sequence[Any] = ()) -> list[tuple]:
    with cursor() as c:
        c.execute(query, params)
        return c.fetchall()


def execute(query: str, params: Sequence[Any] = ()) -> int:
    with cursor() as c:
        c.execute(query, params)
        return c.rowcount


def lock_rows(model: type[Model], ids: Iterable[int]) -> None:
    """Row locks on `ids`, taken in id order (PostgreSQL; SQLite already has one writer at a time).

    Every writer locks the conversations it touches in id order before changing any of them or
    their rows (ingest in one pass, pipeline.ingest.write.conversations.decide_conversations), so
    concurrent writers queue instead of deadlocking.
    """
    ids = sorted(set(ids))
    if ids and connection.features.has_select_for_update:
        fetch(f"SELECT id FROM {table(model)} WHERE id IN ({marks(ids)}) ORDER BY id FOR UPDATE", ids)


def lock_traces(trace_ids: Iterable[str]) -> None:
    """Serialise the transactions that write the same traces (PostgreSQL; SQLite's one writer
    already does): a transaction-scoped advisory lock per trace, taken in key order.

    Which conversation a trace belongs to is decided from what is stored of it, so two requests
    carrying parts of one trace must not both decide before either has stored anything. Ingest
    takes these before any row lock; two traces sharing a key (a hash) only wait for each other.
    """
    if connection.vendor != "postgresql":
        return
    keys = sorted({int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big", signed=True)
                   for t in trace_ids})
    if keys:  # unnest scans the sorted array in order, so the locks are taken in order
        fetch("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k", [keys])


def is_deadlock(error: BaseException) -> bool:
    """A deadlock or serialization failure the database resolved by aborting us: safe to retry."""
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) in ("40P01", "40001") or "deadlock detected" in str(error)


T = TypeVar("T")


def retrying_deadlocks(work: Callable[[], T], attempts: int = 5) -> T:
    """`work()`, a whole transaction, run again when the database aborted it to end a deadlock (a
    writer that takes its locks in another order than ingest's). Inside an outer transaction the
    error goes up: only the outermost can start again."""
    for attempt in range(attempts):
        try:
            return work()
        except OperationalError as error:
            if attempt == attempts - 1 or connection.in_atomic_block or not is_deadlock(error):
                raise
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


# ---- values ---------------------------------------------------------------------------------

class Prepare:
    """Value → database value functions for JSON and datetimes, bound to this thread's connection.

    The same results as JSONField / DateTimeField.get_db_prep_save; made once per batch because
    every `django.db.connection` attribute access goes through a thread-local lookup.
    """

    def __init__(self) -> None:
        self.connection = connections[DEFAULT_DB_ALIAS]
        self._ops = self.connection.ops
        self._sqlite = self.connection.vendor == "sqlite"
        self.json_as_text = self._sqlite  # json() gives orjson's text (else the backend's adapter)
        self._utc_text = self._sqlite and settings.USE_TZ and self.connection.timezone_name == "UTC"

    def json(self, value: Any) -> Any:
        if self._sqlite:  # JSON text, read back with json.loads: orjson writes the same values 5-10x faster
            try:
                return orjson.dumps(value, option=ORJSON_AS_JSON).decode()
            except TypeError:  # what orjson refuses (keys that are not strings, integers past 64 bits,
                pass  # datetimes, dataclasses): json.dumps decides, as JSONField would
        return self._ops.adapt_json_value(value, None)

    def datetime(self, value: datetime | None) -> Any:
        if self._utc_text and value is not None:  # what the SQLite adapter gives, minus zoneinfo
            if value.tzinfo is UTC and type(value) is datetime:  # the normaliser's: str(value) less its
                # "+00:00", written by orjson 3x faster (its "T" is str()'s space; it refuses subclasses)
                return orjson.dumps(value)[1:-7].decode().replace("T", " ")
            if value.utcoffset() == ZERO:
                return str(value.replace(tzinfo=None))
        return self._ops.adapt_datetimefield_value(value)

    def for_field(self, field: Any) -> Callable[[Any], Any] | None:
        if isinstance(field, JSONField):
            return self.json
        if isinstance(field, DateTimeField):
            return self.datetime
        return integer_clamp(field)  # a token count of 2**40 must not fail the batch on PostgreSQL


def to_datetime(value: Any) -> datetime | None:
    """A datetime column as a raw query returns it: naive UTC (or text) on SQLite, aware on PostgreSQL."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


# ---- writes ---------------------------------------------------------------------------------

def insert_values(
    model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]], *, ignore_conflicts: bool = False
) -> None:
    """INSERT prepared `rows` (values in the order of the columns `names`) with one executemany;
    `ignore_conflicts`: a row a unique constraint refuses is skipped (a concurrent writer's won)."""
    if rows:
        skip = " ON CONFLICT DO NOTHING" if ignore_conflicts else ""
        executemany(f"INSERT INTO {table(model)} ({columns(names)}) VALUES ({marks(names)}){skip}", rows)


def insert_rows(model: type[Model], rows: Sequence[Model], *, ignore_conflicts: bool = False) -> None:
    """INSERT unsaved instances (no primary keys come back: see `fetch_ids`)."""
    if rows:
        names, params = _prepared(model, rows)
        insert_values(model, names, params, ignore_conflicts=ignore_conflicts)


def insert_new(model: type[Model], rows: Sequence[Model], key: str) -> set[Any]:
    """INSERT unsaved instances, skipping those a unique constraint refuses (a concurrent writer's
    won), and return the `key` values of the rows actually inserted.

    One statement per row, told apart by its row count: RETURNING would need SQLite 3.35, and
    the rows are few (a batch's new conversations)."""
    if not rows:
        return set()
    names, params = _prepared(model, rows)
    query = f"INSERT INTO {table(model)} ({columns(names)}) VALUES ({marks(names)}) ON CONFLICT DO NOTHING"
    keys = attrgetter(model._meta.get_field(key).attname)
    return {keys(row) for row, values in zip(rows, params) if execute(query, values) == 1}


def _prepared(model: type[Model], rows: Sequence[Model]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The columns of `model` but its primary key, and each row's values for them, prepared.

    Column by column: each column's preparer is found once, and runs over the column in `map`."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    for f in fields:
        if getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False):
            for row in rows:
                f.pre_save(row, add=True)
    prepare = Prepare()
    table: list[Iterable[Any]] = list(zip(*_values(model, fields, rows), strict=True))
    for i, f in enumerate(fields):
        if prep := prepare.for_field(f):
            table[i] = map(prep, table[i])
    return [f.column for f in fields], list(zip(*table, strict=True))


def _values(model: type[Model], fields: Sequence[Any], rows: Sequence[Model]) -> list[tuple[Any, ...]]:
    """Each row's values of `fields`, as reading the attributes gives them. For plain field descriptors
    that is the instance's dict, read here directly: a foreign key's descriptor is Python code, run on
    every read. A row without one of the values (a deferred field) is read by attribute, which loads it."""
    if len(fields) > 1 and _plain(model, fields):
        try:
            return list(map(itemgetter(*(f.attname for f in fields)), map(vars, rows)))
        except KeyError:
            pass
    return [tuple(getattr(row, f.attname) for f in fields) for row in rows]


def update_rows(model: type[Model], rows: Iterable[Model], names: Sequence[str]) -> int:
    """UPDATE the fields `names` of saved instances, one executemany for all of them."""
    rows = list(rows)
    if not rows:
        return 0
    meta = model._meta
    fields = [meta.get_field(name) for name in names]
    prepare = Prepare()
    preparers = [prepare.for_field(f) for f in fields]
    assignments = ", ".join(f"{quote(f.column)} = %s" for f in fields)
    query = f"UPDATE {table(model)} SET {assignments} WHERE {quote(meta.pk.column)} = %s"
    params = [
        [prep(v) if prep else v for prep, v in zip(preparers, (getattr(row, f.attname) for f in fields), strict=True)]
        + [row.pk]
        for row in rows
    ]
    with rollups.updating(model, rows, names):
        executemany(query, params)
    return len(rows)


def _plain(model: type[Model], fields: Iterable[Any]) -> bool:
    """Whether Model.__init__ would only store each of `fields`' values in the instance's dict:
    plain field descriptors, and no init signal receivers."""
    return (all(type(model.__dict__.get(f.attname)) in (DeferredAttribute, ForeignKeyDeferredAttribute) for f in fields)
            and not pre_init.has_listeners(model) and not post_init.has_listeners(model))


def _constant_default(field: Any) -> bool:
    """Whether `field.get_default()` is the same value for every instance: a default that is not a
    callable (Field.get_default returns that object itself) or none at all (None, or "" for text);
    not a callable one (dict, list, now) nor a database default (a new DatabaseDefault each time)."""
    if field.has_default():
        return not callable(field.default)
    return field.db_default is NOT_PROVIDED


def row_maker(model: type[Model]) -> Callable[..., Model]:
    """A function that builds unsaved instances as `model(**values)` does — every field's default,
    then `values` — for rows ingest builds by the thousand: without Model.__init__'s per-field
    descriptor calls and keyword juggling, which cost more than the rest of building a row.

    The instance is the same: Model.__init__ sets each field's attribute, and for the plain field
    descriptors of these models that stores the value in the instance's dict. A model with init
    signal receivers or another descriptor, and values that name anything but field attnames (a
    related instance, a property), go through Model.__init__ instead.
    """
    fields = [f for f in model._meta.concrete_fields if not f.generated]
    if not _plain(model, fields):
        return model
    # every field, in the constructor's order, with its default where that is one value for every row
    initial = {f.attname: f.get_default() if _constant_default(f) else None for f in fields}
    made = [(f.attname, f.get_default) for f in fields if not _constant_default(f)]  # a fresh value per row
    names = frozenset(initial)
    new = object.__new__

    def make(**values: Any) -> Model:
        if not names.issuperset(values):
            return model(**values)
        row = new(model)
        row._state = ModelState()
        state = row.__dict__
        state.update(initial)
        for name, default in made:
            if name not in values:
                state[name] = default()
        state.update(values)
        return row

    return make


def fetch_ids(model: type[Model], rows: Sequence[Model]) -> None:
    """Set the primary keys of rows just inserted, found again by their (trace_id, span_id)."""
    if not rows:
        return
    by_key = {(row.trace_id, row.span_id): row for row in rows}
    for trace_id, span_id, pk in by_spans(model, ["id"], by_key):
        row = by_key[(trace_id, span_id)]
        row.pk = pk
        row._state.adding = False


# ---- reads ----------------------------------------------------------------------------------

def _converter(field: Any) -> Callable[[Any], Any] | None:
    """What the ORM does to a raw value of `field` that a raw query does not (None: nothing)."""
    if isinstance(field, DateTimeField):
        return to_datetime
    if isinstance(field, JSONField):  # JSON text on SQLite (and from Django's PostgreSQL connection)
        return lambda value: field.from_db_value(value, None, connection)
    return None


def instances(model: type[Model], names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[Model]:
    """Model instances from raw rows of the columns `names` (datetimes and JSON converted as the
    ORM converts them)."""
    meta = model._meta
    fields = [meta.get_field(n) for n in names]
    converters = [_converter(f) for f in fields]
    if _plain(model, fields):  # what from_db makes, without Model.__init__ (see row_maker): a few per round
        return _loaded(model, [f.attname for f in fields], converters, rows)
    # from_db expects the values in the model's field order
    order = sorted(range(len(fields)), key=lambda i: meta.concrete_fields.index(fields[i]))
    attnames = [fields[i].attname for i in order]
    out = []
    for row in rows:
        values = [converters[i](row[i]) if converters[i] else row[i] for i in order]
        out.append(model.from_db(connection.alias, attnames, values))
    return out


def _loaded(model: type[Model], attnames: list[str], converters: list, rows: Iterable[Sequence[Any]]) -> list[Model]:
    """`model.from_db(alias, attnames, values)` for each row: the instance's dict holds the values,
    the fields not read stay deferred (loaded on access), and its state says it is stored."""
    alias, new, out = connection.alias, object.__new__, []
    for row in rows:
        instance = new(model)
        state = instance._state = ModelState()
        state.adding, state.db = False, alias
        instance.__dict__.update(zip(attnames, [convert(value) if convert else value
                                                for convert, value in zip(converters, row)]))
        out.append(instance)
    return out
