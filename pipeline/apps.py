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
        self._connect_rollups()

    def _connect_rollups(self) -> None:
        """Calls and conversations saved through the ORM keep their rollups too (pipeline.rollups.track)."""
        from django.db.models.signals import post_save, pre_delete, pre_save

        from pipeline.models import CompressionEvent, Conversation, LLMCall, ToolCall
        from pipeline.rollups import track

        for model in (LLMCall, ToolCall, CompressionEvent, Conversation):
            pre_save.connect(track.on_pre_save, sender=model, dispatch_uid=f"rollups.pre.{model.__name__}")
            post_save.connect(track.on_post_save, sender=model, dispatch_uid=f"rollups.post.{model.__name__}")
        pre_delete.connect(track.on_conversation_delete, sender=Conversation, dispatch_uid="rollups.conversation")
