"""Pagination that counts only as far as the pages it links to.

An exact COUNT(*) of a table of a million conversations walks a whole index on every list
render and every live refresh. These paginators count the rows of the page asked for and of up
to PAGES_AHEAD pages after it (`SELECT COUNT(*) FROM (... LIMIT n)`): exact when fewer rows
exist, else a lower bound, flagged by `more`, that still grows as one pages on.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from rest_framework.pagination import LimitOffsetPagination

PAGES_AHEAD = 10
# The largest page number or offset a count is computed from: the LIMIT built from a larger one
# overflows the database's integer (SQLite "datatype mismatch", PostgreSQL bigint out of range).
# Past it, a page is past the end anyway (an empty API page, the list's last page).
MAX_POSITION = 2**31 - 1


def _page_number(value: object) -> int:
    try:
        return min(max(1, int(str(value))), MAX_POSITION)
    except (TypeError, ValueError):
        return 1


def counted_up_to(queryset: QuerySet, limit: int) -> int:
    """How many rows the query has, counting no further than `limit`."""
    return queryset.order_by()[:limit].count()


class CappedPaginator(Paginator):
    """A Paginator whose count stops PAGES_AHEAD pages past `page_number` (the page about to be
    shown): `count` and `num_pages` are then lower bounds, and `more` is True."""

    def __init__(self, object_list: QuerySet, per_page: int, page_number: object) -> None:
        super().__init__(object_list, per_page)
        self.limit = (_page_number(page_number) + PAGES_AHEAD) * per_page + 1

    @cached_property
    def _counted(self) -> int:
        return counted_up_to(self.object_list, self.limit)

    @cached_property
    def count(self) -> int:
        return min(self._counted, self.limit - 1)

    @property
    def more(self) -> bool:
        return self._counted >= self.limit


class CappedLimitOffsetPagination(LimitOffsetPagination):
    """LimitOffsetPagination whose `count` stops PAGES_AHEAD pages past the one returned: exact
    up to there, else that bound (`next` is then set: page on to count further)."""

    def get_offset(self, request: Any) -> int:
        return min(super().get_offset(request), MAX_POSITION)

    def get_count(self, queryset: QuerySet) -> int:
        limit = self.get_limit(self.request) or self.default_limit
        cap = self.get_offset(self.request) + limit * (1 + PAGES_AHEAD)
        return min(counted_up_to(queryset, cap + 1), cap)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        response = super().get_paginated_response_schema(schema)
        response["properties"]["count"]["description"] = (
            f"How many rows match, counted at most {PAGES_AHEAD} pages (of `limit`) past this one: "
            "past that, this bound, and `next` is set.")
        return response
