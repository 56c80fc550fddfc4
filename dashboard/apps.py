from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "ctxlens dashboard"

    def ready(self) -> None:
        from dashboard.live import connect_receivers

        connect_receivers()  # ingest commits → websocket groups
