"""What the admin's pages do for every model holding bulk: lists and delete pages that read no
more than they show, delete pages started again after a deadlock, rows kept by ingest alone."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db import router
from django.db.models import Model, QuerySet
from django.db.models.deletion import Collector, ProtectedError, RestrictedError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import capfirst

from pipeline.ingest.write import sql
from pipeline.rollups import track as rollups


class ChangeListWithoutBulk(ChangeList):
    """A change list that leaves out its model admin's `list_defer` columns."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: list[str] | None = None) -> QuerySet:
        return super().get_queryset(request, exclude_parameters).defer(*self.model_admin.list_defer)


class ListsWithoutBulk:
    """Change lists leave out the columns that hold a row's bulk and that no list column shows
    (messages, observations, raw attributes: megabytes, perhaps, per row): a page of 100 LLM
    calls read and decoded every message of each. Searching and filtering still use them."""

    list_defer: tuple[str, ...] = ()

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return ChangeListWithoutBulk


class CountsWhatCascades:
    """The delete page and the delete action list the rows chosen, and count by kind the rows under
    them that go too, where Django's admin linked every one, read whole: for a conversation of
    2,000 turns, 8 s and 2.2 MB of page, every message read, and all of it again on confirming.
    The rows under them are read by id alone (Django's delete collector), never whole."""

    def get_deleted_objects(self, objs: Iterable[Model], request: HttpRequest
                            ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        objs = list(objs)
        collector = Collector(using=router.db_for_write(self.model))  # type: ignore[attr-defined]
        try:
            collector.collect(objs)
        except (ProtectedError, RestrictedError):  # Django's page names what protects them (no model here does)
            return super().get_deleted_objects(objs, request)  # type: ignore[misc]
        ids = rollups.collected_ids(collector)
        site = self.admin_site  # type: ignore[attr-defined]
        perms_needed = {model._meta.verbose_name for model, pks in ids.items() if pks and site.is_registered(model)
                        and not site.get_model_admin(model).has_delete_permission(request)}
        return ([self._linked(row) for row in objs],
                {model._meta.verbose_name_plural: len(pks) for model, pks in ids.items() if pks}, perms_needed, [])

    def _linked(self, row: Model) -> str:
        """`row`, of this admin's model, linked to its change page as Django's list links it."""
        opts = row._meta
        url = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",  # type: ignore[attr-defined]
                      args=[quote(row.pk)])
        return format_html('{}: <a href="{}">{}</a>', capfirst(opts.verbose_name), url, row)


class DeletesStartAgainAfterDeadlock:
    """The delete page's transaction, started again when PostgreSQL ended a deadlock by aborting it."""

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: dict | None = None) -> HttpResponse:
        view = super().delete_view  # type: ignore[misc]
        return sql.retrying_deadlocks(lambda: view(request, object_id, extra_context))


class KeptByIngest:
    """An admin of rows ingest keeps: they are viewed here, never added or edited."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
