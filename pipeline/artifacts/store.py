"""The server's artifact sandbox: large tool results kept as files with an Artifact row each.

Files live directly in `ctxlens_config().artifact_dir`, named `artifact_<sha256 hex>` (the
first 32 hex digits; the full 64 if two contents ever share that prefix). Same content →
same id and one file. Every file has an Artifact row; the row's deletion removes the file on
commit (pipeline.models.artifacts). No function here puts a filesystem path into a return
value or an exception message: callers show `artifact_id`s, never paths. The file side (id
validation, atomic writes, opening without following links) is the runtime's
(pipeline.runtime.artifacts), shared with an agent's own local store.

Public API:
- `store_artifact(content, *, summary, mime, token_count, conversation, ttl_hours) -> Artifact`
- `read_artifact(artifact_id, *, max_bytes=None) -> ArtifactContent` (validates, stays in the sandbox)
- `open_artifact(artifact) -> BinaryIO` (the same checks and the row's size and sha256, for streaming downloads)
- `ServerArtifactStore`: the runtime's ArtifactStore protocol over these, for agents run by the server
- `validate_artifact_id(value) -> str`
- errors: `ArtifactError` > `InvalidArtifactId`, `ArtifactNotFound`, `ArtifactStorageError`
Cleanup (TTL, size cap, orphans) is in `pipeline.artifacts.cleanup`; the model's tool to read an
artifact is `pipeline.runtime.artifact_tool.read_artifact_tool(store)`. Nothing here imports
LangChain, so the server's ingest and pages do not load it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.db import transaction
from django.utils import timezone

from pipeline.conf import ctxlens_config
from pipeline.models import Artifact
from pipeline.runtime.artifacts import (  # noqa: F401  (re-exported: the server's callers import them from here)
    TEMP_PREFIX,
    ArtifactContent,
    ArtifactError,
    ArtifactNotFound,
    ArtifactStorageError,
    InvalidArtifactId,
    artifact_id_for,
    errno_name,
    has_file,
    open_regular_file,
    prepare_sandbox,
    storage_error,
    validate_artifact_id,
    write_atomically,
)
from pipeline.runtime.artifacts import sandbox_path as _sandbox_path

logger = logging.getLogger(__name__)


def sandbox_dir() -> Path:
    """The resolved sandbox directory, created (mode 0700) when missing."""
    return prepare_sandbox(ctxlens_config().artifact_dir)


def sandbox_path(artifact_id: str) -> Path:
    """Where an artifact's file lives. Internal: never show the result to a user."""
    return _sandbox_path(sandbox_dir(), artifact_id)


def _restore_file(root: Path, name: str, data: bytes) -> None:
    if has_file(root / name, len(data)):
        return
    try:
        write_atomically(root, name, data)
    except OSError as exc:  # the row stays; the next store of the same content writes the file
        logger.warning("restoring %s failed: %s", name, errno_name(exc))


def store_artifact(
    content: str | bytes,
    *,
    summary: str = "",
    mime: str = "text/plain",
    token_count: int | None = None,
    conversation: Any = None,
    ttl_hours: float | None = None,
) -> Artifact:
    """Keep `content` in the sandbox and return its Artifact row.

    Identical content is stored once: a second store returns the same row with its expiry
    pushed out and last_accessed_at refreshed. Raises ArtifactStorageError (e.g. disk full),
    leaving neither a row nor a temp file behind.
    """
    data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    sha = hashlib.sha256(data).hexdigest()
    now = timezone.now()
    ttl = ctxlens_config().artifact_ttl_hours if ttl_hours is None else ttl_hours
    expires_at = now + timedelta(hours=ttl)
    artifact_id = artifact_id_for(sha)
    if Artifact.objects.filter(artifact_id=artifact_id).exclude(sha256=sha).exists():
        artifact_id = artifact_id_for(sha, full=True)  # a prefix collision: fall back to the full hash
    root = sandbox_dir()
    wrote_new_file = False
    try:
        with transaction.atomic():
            row, created = Artifact.objects.select_for_update().get_or_create(
                artifact_id=artifact_id,
                defaults={
                    "sha256": sha,
                    "size": len(data),
                    "mime": mime,
                    "summary": summary,
                    "token_count": token_count,
                    "conversation": conversation,
                    "created_at": now,
                    "expires_at": expires_at,
                    "last_accessed_at": now,
                },
            )
            if not has_file(root / artifact_id, len(data)):
                write_atomically(root, artifact_id, data)
                wrote_new_file = created
            elif created:
                # The file outlived a row whose deletion committed just before this one was created;
                # that deletion unlinks it on its commit, maybe after our check. Look again once
                # this row is committed.
                transaction.on_commit(lambda: _restore_file(root, artifact_id, data))
            if not created:
                row.last_accessed_at = now
                if row.expires_at is not None:  # None means kept until evicted; do not shorten it
                    row.expires_at = max(row.expires_at, expires_at)
                row.summary = row.summary or summary
                row.token_count = row.token_count if row.token_count is not None else token_count
                row.conversation = row.conversation or conversation
                row.save(update_fields=["last_accessed_at", "expires_at", "summary", "token_count", "conversation"])
    except OSError as exc:
        logger.warning("storing %s failed: %s", artifact_id, errno_name(exc))
        raise storage_error(exc) from None
    except BaseException:
        if wrote_new_file:
            (root / artifact_id).unlink(missing_ok=True)
        raise
    return row


def read_artifact(artifact_id: object, *, max_bytes: int | None = None) -> ArtifactContent:
    """Read an artifact by id, never leaving the sandbox, and mark it used (for LRU eviction).

    Refuses malformed ids (InvalidArtifactId), unknown or expired ids and anything in the
    sandbox that is not a regular file, e.g. a symlink (ArtifactNotFound). A whole read is
    checked against the stored sha256.
    """
    aid = validate_artifact_id(artifact_id)
    row = Artifact.objects.filter(artifact_id=aid).first()
    if row is None or row.is_expired:
        raise ArtifactNotFound(f"{aid} does not exist or has expired")
    with open_regular_file(sandbox_dir(), aid) as fh:
        data = fh.read() if max_bytes is None else fh.read(max_bytes)
    if max_bytes is None and hashlib.sha256(data).hexdigest() != row.sha256:
        raise ArtifactError(f"{aid} failed its integrity check")
    Artifact.objects.filter(pk=row.pk).update(last_accessed_at=timezone.now())
    return ArtifactContent(artifact_id=aid, data=data, size=row.size, mime=row.mime, summary=row.summary)


def open_artifact(artifact: Artifact) -> BinaryIO:
    """The artifact's file opened for reading, for streaming a download (the caller closes it).

    The same fences as read_artifact: a valid id, a file directly in the sandbox, a regular
    file and never a symlink (a link planted in the sandbox would otherwise serve any file the
    server can read) nor a FIFO. Then the content must be the row's: its size and sha256 are
    checked before a byte is served, so a file planted under an artifact's name (a hard link
    to another file passes every fence above) is refused. InvalidArtifactId, ArtifactNotFound
    or ArtifactError otherwise. Unlike read_artifact it does not mark the artifact used: an
    operator's look keeps nothing alive.
    """
    handle = open_regular_file(sandbox_dir(), validate_artifact_id(artifact.artifact_id))
    try:
        if os.fstat(handle.fileno()).st_size != artifact.size or _sha256(handle) != artifact.sha256:
            raise ArtifactError(f"{artifact.artifact_id} failed its integrity check")
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    return handle


def _sha256(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(1024 * 1024):
        digest.update(chunk)
    return digest.hexdigest()


class ServerArtifactStore:
    """The runtime's ArtifactStore (pipeline.runtime.artifacts) over the Artifact model, for
    agents the server runs: every artifact gets a row, linked to ExecutionContext.conversation."""

    @property
    def directory(self) -> Path:
        """The sandbox, so the executor can take it out of error messages."""
        return ctxlens_config().artifact_dir

    def store(
        self, data: bytes, *, summary: str = "", mime: str = "text/plain",
        token_count: int | None = None, conversation: Any = None,
    ) -> str:
        row = store_artifact(data, summary=summary, mime=mime, token_count=token_count, conversation=conversation)
        return row.artifact_id

    def read(self, artifact_id: str, *, max_bytes: int | None = None) -> ArtifactContent:
        return read_artifact(artifact_id, max_bytes=max_bytes)

    def exists(self, artifact_id: str) -> bool:
        return Artifact.objects.filter(artifact_id=artifact_id).exclude(expires_at__lte=timezone.now()).exists()
