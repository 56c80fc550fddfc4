"""Django's SQLite backend, with each statement's placeholder conversion remembered.

Django writes `%s` placeholders and its SQLite cursor turns them into `?` with a regular
expression on every execute; ingest sends the same few dozen statements thousands of times
(measured: 6 % of a one-span request's CPU, 2 % of a 100-span one's). Here each statement's
converted text is kept (the conversion depends on the text alone), and `executemany` hands a
list of rows to sqlite3 as it is rather than through `itertools.tee`.

Selected by settings.DATABASES (ENGINE "config.sqlite3"); everything else is Django's backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from django.db.backends.sqlite3 import base

# Longer statements (IN lists of thousands) are rare and their own work dwarfs the conversion.
MAX_REMEMBERED = 8192


@lru_cache(maxsize=512)
def _remembered_qmark(query: str) -> str:
    return _qmark(query)


def _qmark(query: str) -> str:
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


def qmark(query: str) -> str:
    """`query` with Django's `%s` placeholders as SQLite's `?` (and `%%` as `%`)."""
    return _remembered_qmark(query) if len(query) <= MAX_REMEMBERED else _qmark(query)


class SQLiteCursorWrapper(base.SQLiteCursorWrapper):
    def convert_query(self, query, *, param_names=None):
        if param_names is None:
            return qmark(query)
        return super().convert_query(query, param_names=param_names)

    def executemany(self, query, param_list):
        if isinstance(param_list, list | tuple) and not (param_list and isinstance(param_list[0], Mapping)):
            return base.Database.Cursor.executemany(self, qmark(query), param_list)
        return super().executemany(query, param_list)


class DatabaseWrapper(base.DatabaseWrapper):
    def create_cursor(self, name=None):
        return self.connection.cursor(factory=SQLiteCursorWrapper)
