from __future__ import annotations

from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "ctxlens pipeline"

    def ready(self) -> None:
        from pipeline import checks, conf  # noqa: F401  (registers checks and receivers)
        from pipeline.artifacts import periodic  # noqa: F401  (the periodic artifact cleanup's receiver)

        conf.install_runtime_settings()
