"""Small builders for rows the tests need; real models, real database."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from pipeline.models import Artifact, Conversation


def make_conversation(external_id: str = "conv-1", **fields) -> Conversation:
    now = timezone.now()
    fields.setdefault("started_at", now)
    fields.setdefault("last_activity_at", now)
    return Conversation.objects.create(external_id=external_id, **fields)


def make_artifact(sandbox: Path, content: bytes, *, expires_in: timedelta | None = timedelta(hours=24), **fields) -> Artifact:
    digest = hashlib.sha256(content).hexdigest()
    artifact_id = f"artifact_{digest[:32]}"
    (sandbox / artifact_id).write_bytes(content)
    expires_at = timezone.now() + expires_in if expires_in is not None else None
    return Artifact.objects.create(
        artifact_id=artifact_id, sha256=digest, size=len(content), expires_at=expires_at, **fields
    )
