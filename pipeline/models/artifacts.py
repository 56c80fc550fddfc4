"""Large tool outputs kept as files in the artifact sandbox; the row is the only handle to them."""

from __future__ import annotations

import re
from pathlib import Path

from django.db import models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from pipeline.conf import ctxlens_config
from pipeline.models.conversations import Conversation

ARTIFACT_ID_RE = re.compile(r"\Aartifact_[0-9a-f]{16,64}\Z")


class ArtifactQuerySet(models.QuerySet):
    def expired(self, now=None) -> ArtifactQuerySet:
        return self.filter(expires_at__lte=now or timezone.now())



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
