from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from dashboard.views.health import healthz
from pipeline.receivers.otlp_http import otlp_logs, otlp_traces
from pipeline.receivers.otlp_metrics import otlp_metrics

handler400 = "dashboard.views.errors.bad_request"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("v1/traces", otlp_traces, name="otlp-traces"),
    path("v1/logs", otlp_logs, name="otlp-logs"),
    path("v1/metrics", otlp_metrics, name="otlp-metrics"),
    path("admin/", admin.site.urls),
    path("api/", include("dashboard.api.urls")),
    path("", include("dashboard.urls")),
]
