"""The artifact sandbox: large tool results kept as files, handed to the model by id only.

Files live directly in `ctxlens_config().artifact_dir`, named `artifact_<sha256 hex>` (the
first 32 hex digits; the full 64 if two contents ever share that prefix). Same content →
same id and one file. Every file has an Artifact row; the row's deletion removes the file on
commit (pipeline.models.artifacts). No function here puts a filesystem path into a return
value or an exception message: callers show `artifact_id`s, never paths.

Public API:
- `store_artifact(content, *, summary, mime, token_count, conversation, ttl_hours) -> Artifact`
- `read_artifact(artifact_id, *, max_bytes=None) -> ArtifactContent` (validates, stays in the sandbox)
- `open_artifact(artifact_id) -> BinaryIO` (the same checks, for streaming downloads)
- `validate_artifact_id(value) -> str`
- errors: `ArtifactError` > `InvalidArtifactId`, `ArtifactNotFound`, `ArtifactStorageError`
Cleanup (TTL, size cap, orphans) is in `pipeline.artifact_cleanup`; the model's tool to read an
artifact is `pipeline.artifact_tool.read_artifact_tool()`. Nothing here imports LangChain, so
the server's ingest and pages do not load it.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.db import transaction
from django.utils import timezone

from pipeline.conf import ctxlens_config
from pipeline.models import Artifact
from pipeline.models.artifacts import ARTIFACT_ID_RE

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"  # never matches ARTIFACT_ID_RE, so a half-written file is never served
SHORT_ID_HEX = 32
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class ArtifactError(Exception):
    """An artifact could not be stored or read. The message is safe to show: it holds no path."""


class InvalidArtifactId(ArtifactError):
    pass


class ArtifactNotFound(ArtifactError):
    pass


class ArtifactStorageError(ArtifactError):
    pass


@dataclass(frozen=True)
class ArtifactContent:
    artifact_id: str
    data: bytes
    size: int  # of the whole artifact; `data` may be shorter when max_bytes was given
    mime: str
    summary: str

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def validate_artifact_id(value: object) -> str:
    """The id itself if it is exactly `artifact_<16-64 lowercase hex>`, else InvalidArtifactId.

    No decoding or normalisation happens first: percent-encoded, fullwidth or other look-alike
    characters are simply not in the allowed alphabet.
    """
    if not isinstance(value, str) or not ARTIFACT_ID_RE.match(value):
        raise InvalidArtifactId("invalid artifact id: expected artifact_ followed by 16-64 hex digits")
    return value


def sandbox_dir() -> Path:
    """The resolved sandbox directory, created (mode 0700) when missing."""
    root = Path(ctxlens_config().artifact_dir)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root.resolve()


def sandbox_path(artifact_id: str) -> Path:
    """Where an artifact's file lives. Internal: never show the result to a user."""
    root = sandbox_dir()
    path = root / validate_artifact_id(artifact_id)
    if path.parent != root:  # cannot happen for a valid id; kept as a second fence
        raise InvalidArtifactId("invalid artifact id")
    return path


def _storage_error(exc: OSError) -> ArtifactStorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ArtifactStorageError("artifact storage is full: free space or lower CTXLENS_ARTIFACT_MAX_TOTAL_BYTES")
    return ArtifactStorageError(f"artifact could not be written ({errno.errorcode.get(exc.errno or 0, 'I/O error')})")


def _write_atomically(root: Path, name: str, data: bytes) -> None:
    """Write to a temp file in the sandbox, fsync, then rename over `name`; no temp file survives a failure."""
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=root)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, root / name)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


def _has_file(path: Path, size: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def _restore_file(root: Path, name: str, data: bytes) -> None:
    if _has_file(root / name, len(data)):
        return
    try:
        _write_atomically(root, name, data)
    except OSError as exc:  # the row stays; the next store of the same content writes the file
        logger.warning("restoring %s failed: %s", name, errno.errorcode.get(exc.errno or 0, "I/O error"))


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
    artifact_id = f"artifact_{sha[:SHORT_ID_HEX]}"
    if Artifact.objects.filter(artifact_id=artifact_id).exclude(sha256=sha).exists():
        artifact_id = f"artifact_{sha}"  # a prefix collision: fall back to the full hash
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
            if not _has_file(root / artifact_id, len(data)):
                _write_atomically(root, artifact_id, data)
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
        logger.warning("storing %s failed: %s", artifact_id, errno.errorcode.get(exc.errno or 0, "I/O error"))
        raise _storage_error(exc) from None
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
    with _open_regular_file(aid) as fh:
        data = fh.read() if max_bytes is None else fh.read(max_bytes)
    if max_bytes is None and hashlib.sha256(data).hexdigest() != row.sha256:
        raise ArtifactError(f"{aid} failed its integrity check")
    Artifact.objects.filter(pk=row.pk).update(last_accessed_at=timezone.now())
    return ArtifactContent(artifact_id=aid, data=data, size=row.size, mime=row.mime, summary=row.summary)


def open_artifact(artifact_id: object) -> BinaryIO:
    """The artifact's file opened for reading, for streaming a download (the caller closes it).

    The same fences as read_artifact: a valid id, a file directly in the sandbox, a regular
    file and never a symlink (a link planted in the sandbox would otherwise serve any file the
    server can read) nor a FIFO. InvalidArtifactId or ArtifactNotFound otherwise. Unlike
    read_artifact it does not mark the artifact used: an operator's look keeps nothing alive.
    """
    return _open_regular_file(validate_artifact_id(artifact_id))


def _open_regular_file(aid: str) -> BinaryIO:
    """The sandbox file of a valid id, opened without following a symlink and refused unless it
    is a regular file. O_NONBLOCK keeps a FIFO planted under an artifact's name from blocking
    the open; it is cleared again before anything is read."""
    try:
        fd = os.open(sandbox_path(aid), os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except OSError:
        raise ArtifactNotFound(f"{aid} has no readable content") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ArtifactNotFound(f"{aid} has no readable content")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
