"""Dashboard reads from a read replica (DATABASE_REPLICA_URL); everything else uses the primary.

Only GET and HEAD requests — the dashboard's pages and read API — read the replica,
and only the trace data (the `pipeline` models other than API keys): `ReplicaReadsMiddleware`
marks such a request, `ReplicaRouter` routes its reads. Ingest, logins, sessions, API keys,
background work (deferred token counts, finding counts, cleanup) and management commands
always read the primary, so nothing is ever written from a stale read and a new key or login
works at once. A page lags the primary by the replica's delay, as a dashboard may; its live
fragments, fetched when the websocket says what was just committed, read the primary.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from django.db.models import Model
from django.http import HttpRequest, HttpResponse

REPLICA = "replica"
LIVE_PATHS = ("/fragments/",)
_reading_replica: ContextVar[bool] = ContextVar("ctxlens_reading_replica", default=False)
# Read on the primary even during a dashboard request: keys are checked by every request and
# must work as soon as they are made.
_PRIMARY_ONLY = frozenset({"pipeline.apikey"})


class ReplicaRouter:
    def db_for_read(self, model: type[Model], **hints: object) -> str | None:
        if _reading_replica.get() and model._meta.app_label == "pipeline" \
                and model._meta.label_lower not in _PRIMARY_ONLY:
            return REPLICA
        return None  # the primary

    def db_for_write(self, model: type[Model], **hints: object) -> str:
        return "default"

    def allow_relation(self, obj1: Model, obj2: Model, **hints: object) -> bool:
        return True  # the replica holds the primary's rows

    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool:
        return db != REPLICA  # it replicates the primary's schema


class ReplicaReadsMiddleware:
    """Marks a GET or HEAD request so that its trace-data reads go to the replica."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # Live fragments follow a websocket notice of a commit on the primary: a lagging replica
        # would miss it, and no second notice comes.
        if request.method not in ("GET", "HEAD") or request.path.startswith(LIVE_PATHS):
            return self.get_response(request)
        token = _reading_replica.set(True)
        try:
            return self.get_response(request)
        finally:
            _reading_replica.reset(token)
