from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from dashboard.views.health import healthz
from pipeline.receivers.otlp_http import otlp_logs, otlp_traces

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("v1/traces", otlp_traces, name="otlp-traces"),
    path("v1/logs", otlp_logs, name="otlp-logs"),
    path("admin/", admin.site.urls),
    path("api/", include("dashboard.api.urls")),
    path("", include("dashboard.urls")),
]
