from __future__ import annotations

from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "ctxlens pipeline"

    def ready(self) -> None:
        from pipeline import checks, conf  # noqa: F401  (registers checks and receivers)
        from pipeline.artifacts import periodic  # noqa: F401  (the periodic artifact cleanup's receiver)
        from pipeline.insight.finding_counts import on_ingest_committed
        from pipeline.signals import ingest_committed

        conf.install_runtime_settings()
        # after an ingest commit, the changed conversations' finding counts are refreshed
        ingest_committed.connect(on_ingest_committed, dispatch_uid="pipeline.finding_counts")
