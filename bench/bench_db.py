"""The database a page or API bench fills and measures: SQLite or PostgreSQL, by DATABASE_URL.

Without DATABASE_URL (or with a sqlite:// one) a bench uses a SQLite file in its temporary
directory. With DATABASE_URL=postgres://… it creates a database of its own on that server,
`ctxlens_bench_<pid>`, and drops it at the end; the database DATABASE_URL names is only
connected to for CREATE and DROP DATABASE, never written to. With --keep the database is named
after the kept directory instead, reused by the next run and left in place.

    with bench_database(work_dir, keep=args.keep) as url:
        os.environ["DATABASE_URL"] = url          # then django.setup()

Then, with Django set up, the same calls on either engine: bulk_insert (COPY on PostgreSQL,
executemany on SQLite), fast_writes, reset_sequences after rows inserted with their ids, analyze
once loaded, and full_scans, which reads each query's plan (EXPLAIN QUERY PLAN on SQLite, EXPLAIN (FORMAT JSON)
on PostgreSQL) for a whole big table read.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BIG_TABLES = ("pipeline_span", "pipeline_llmcall", "pipeline_toolcall", "pipeline_round", "pipeline_conversation",
              "pipeline_compressionevent", "pipeline_rollup")
NEVER = ("test", "test_test")  # other people's databases on the shared server


def server_url() -> str | None:
    """DATABASE_URL when it names a PostgreSQL server, else None (SQLite)."""
    url = os.environ.get("DATABASE_URL", "")
    return url if url.split(":", 1)[0] in ("postgres", "postgresql", "pgsql") else None


def engine_name() -> str:
    return "PostgreSQL" if server_url() else "SQLite"


def reproduce_prefix() -> str:
    """What to put before a printed reproduce command: the server (without a password), if any."""
    url = server_url()
    if not url:
        return ""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    if len(netloc) == 2:
        netloc[0] = netloc[0].split(":", 1)[0]
    return f"DATABASE_URL={urlunsplit(parts._replace(netloc='@'.join(netloc)))} "


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@contextmanager
def bench_database(work: Path, keep: str | None = None) -> Iterator[str]:
    """The DATABASE_URL to measure on: a SQLite file in `work`, or a PostgreSQL database of this
    bench's own on DATABASE_URL's server (created now, dropped after unless `keep`)."""
    url = server_url()
    if not url:
        yield f"sqlite:///{Path(work) / 'bench.sqlite3'}"
        return
    import psycopg

    if keep:
        name = f"ctxlens_bench_kept_{hashlib.sha256(str(Path(keep).resolve()).encode()).hexdigest()[:10]}"
    else:
        name = f"ctxlens_bench_{os.getpid()}"
    if name in NEVER or name == urlsplit(url).path.lstrip("/"):
        raise SystemExit(f"refusing to use the database {name!r}: it is not this bench's own")
    with psycopg.connect(url, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists and not keep:  # a crashed run's (process ids come back): its rows would skew the figures
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        if not exists or not keep:
            admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(url, name)
    finally:
        if not keep:
            from django.conf import settings
            from django.db import connections

            if settings.configured:
                connections.close_all()
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


def fast_writes() -> None:
    """Bulk loading on this connection does not wait for the disk: the data is throw-away."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off" if postgres() else "PRAGMA synchronous=OFF")


def _sqlite_value(value: object) -> object:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).replace(tzinfo=None).isoformat(" ")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def _postgres_value(value: object) -> object:
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def bulk_insert(model, rows: list[dict]) -> None:
    """Every column of `rows` (defaults filled in) into the model's table: far faster than
    bulk_create — COPY on PostgreSQL, one executemany on SQLite. Rows that give their id
    need reset_sequences afterwards on PostgreSQL."""
    from django.db import connection
    from django.db.models import NOT_PROVIDED

    with_id = bool(rows) and model._meta.pk.attname in rows[0]
    fields = [f for f in model._meta.concrete_fields if with_id or not f.primary_key]
    defaults = {}
    for f in fields:
        if f.default is not NOT_PROVIDED:
            defaults[f.attname] = f.get_default()
        elif f.null:
            defaults[f.attname] = None
        elif getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False):
            defaults[f.attname] = datetime.now(timezone.utc)
        else:
            defaults[f.attname] = ""
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor:
        if postgres():
            with cursor.cursor.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(tuple(_postgres_value(row.get(f.attname, defaults.get(f.attname))) for f in fields))
        else:
            sql = f"INSERT INTO {model._meta.db_table} ({columns}) VALUES ({', '.join('?' * len(fields))})"
            cursor.executemany(sql, [tuple(_sqlite_value(row.get(f.attname, defaults.get(f.attname)))
                                           for f in fields) for row in rows])


def analyze(table: str = "") -> None:
    """Statistics of the loaded tables for the planner, so it plans for their real sizes. On
    PostgreSQL VACUUM ANALYZE: the visibility map it sets, as autovacuum would in a settled
    database, lets the planner read an index alone (an index-only scan). All tables, or `table`."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"{'VACUUM ANALYZE' if postgres() else 'ANALYZE'} {table}".rstrip())


def reset_sequences(*models) -> None:
    """After rows inserted with their own ids: the next id each table hands out follows them
    (PostgreSQL's sequences; SQLite needs nothing)."""
    from django.core.management.color import no_style
    from django.db import connection

    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), models):
            cursor.execute(sql)


# Plan nodes that read all their input before giving a row: a LIMIT above one does not stop
# the scans below it early.
BLOCKING = ("Sort", "Hash", "Materialize", "WindowAgg", "SetOp", "Gather Merge")


def _plan_nodes(node: dict, limited: bool = False) -> Iterator[tuple[dict, bool]]:
    """Every node of a PostgreSQL plan, with whether a Limit above it stops it early."""
    if node["Node Type"] == "Limit":
        limited = True
    elif node["Node Type"] in BLOCKING or (node["Node Type"] == "Aggregate" and node.get("Strategy") != "Sorted"):
        limited = False
    yield node, limited
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child, limited)


def _partial(cursor, index: str) -> bool:
    """Whether a PostgreSQL index holds only the rows of its WHERE (a walk of it is bounded by that)."""
    cursor.execute("SELECT i.indpred IS NOT NULL FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                   " WHERE c.relname = %s", [index])
    row = cursor.fetchone()
    return bool(row and row[0])


def _select(sql: str) -> str | None:
    """The SELECT a captured query runs, or None: on PostgreSQL, QuerySet.iterator() reads
    through a server-side cursor, `DECLARE "…" NO SCROLL CURSOR WITH HOLD FOR SELECT …`."""
    sql = sql.lstrip()
    if sql.upper().startswith("DECLARE ") and " FOR SELECT " in sql.upper():
        sql = sql[sql.upper().index(" FOR SELECT ") + 5:]
    return sql if sql.upper().startswith("SELECT") else None


def full_scans(queries: list[dict], tables: tuple[str, ...] = BIG_TABLES) -> list[str]:
    """Queries whose plan reads a whole big table. SQLite: SCAN <table>, or SCAN <table> USING
    INDEX (a walk of the whole index) in a query without a LIMIT to stop it early. PostgreSQL
    (EXPLAIN (FORMAT JSON)): a Seq Scan of the table, or an index scan without an index
    condition (of an index of all rows, not a partial one), that no Limit node above it stops
    early (none, or one above a node that reads all its input first: a sort, a hash, a hashed or
    plain aggregate)."""
    from django.db import connection

    found = []
    with connection.cursor() as cursor:
        for query in queries:
            sql = _select(query["sql"])
            if sql is None:
                continue
            if postgres():
                cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
                plan = cursor.fetchone()[0]
                plan = json.loads(plan) if isinstance(plan, str) else plan
                for node, limited in _plan_nodes(plan[0]["Plan"]):
                    table = node.get("Relation Name")
                    if table not in tables or limited:
                        continue
                    whole_index = (node["Node Type"] in ("Index Scan", "Index Only Scan") and "Index Cond" not in node
                                   and not _partial(cursor, node["Index Name"]))
                    if node["Node Type"] == "Seq Scan" or whole_index:
                        detail = f"{node['Node Type']} on {table}" + (f" using {node['Index Name']}" if whole_index else "")
                        found.append(f"{detail}  <-  {sql[:160]}")
            else:
                cursor.execute("EXPLAIN QUERY PLAN " + sql)
                for row in cursor.fetchall():
                    detail = row[-1]
                    big = detail.startswith("SCAN ") and any(t in detail for t in tables)
                    if big and ("USING" not in detail or " LIMIT " not in sql):
                        found.append(f"{detail}  <-  {sql[:160]}")
    return found
