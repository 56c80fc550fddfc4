"""Large tool outputs kept as files in the artifact sandbox; the row is the only handle to them."""

from __future__ import annotations

from pathlib import Path

from django.db import models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from pipeline.conf import ctxlens_config
from pipeline.models.conversations import Conversation
from pipeline.runtime.artifacts import ARTIFACT_ID_RE



class ArtifactQuerySet(models.QuerySet):
    def expired(self, now=None) -> ArtifactQuerySet:
        return self.filter(expires_at__lte=now or timezone.now())

    def unused(self, *, besides: models.QuerySet | None = None) -> ArtifactQuerySet:
        """Artifacts no tool call refers to (other than the tool calls `besides`, about to go too).

        Artifacts are content-addressed: a later tool call with the same output links the
        artifact another conversation stored first, so its owner says nothing about its use.
        """
        from pipeline.models.calls import ToolCall

        users = ToolCall.objects.filter(artifact_id=models.OuterRef("pk"))
        if besides is not None:
            users = users.exclude(pk__in=besides.values("pk"))
        return self.filter(~models.Exists(users))


class Artifact(models.Model):
    artifact_id = models.CharField(max_length=80, unique=True)
    sha256 = models.CharField(max_length=64, db_index=True)
    size = models.BigIntegerField()
    mime = models.CharField(max_length=255, default="text/plain")
    summary = models.TextField(blank=True)
    token_count = models.IntegerField(null=True, blank=True)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_accessed_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = ArtifactQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.artifact_id

    @staticmethod
    def is_valid_id(artifact_id: str) -> bool:
        return bool(ARTIFACT_ID_RE.match(artifact_id))

    @property
    def file_path(self) -> Path:
        """Where the content lives; inside the sandbox by construction, never shown to a user."""
        if not self.is_valid_id(self.artifact_id):
            raise ValueError("invalid artifact id")
        return ctxlens_config().artifact_dir / self.artifact_id

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


@receiver(post_delete, sender=Artifact)
def _delete_artifact_file(sender: type[Artifact], instance: Artifact, **kwargs: object) -> None:
    """A row and its file go together: also on bulk deletes and cascades, and only once committed."""
    if Artifact.is_valid_id(instance.artifact_id):
        path = instance.file_path
        transaction.on_commit(lambda: path.unlink(missing_ok=True))
