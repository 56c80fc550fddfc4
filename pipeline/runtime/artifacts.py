"""The artifact sandbox's file side, and where the runtime keeps large tool results.

A tool result over the threshold (or asked for at FULL level) is kept by an `ArtifactStore` and
handed to the model as an id, `artifact_<16-64 lowercase hex>`; no path ever reaches an
observation, an error or a log line. Files live directly in a sandbox directory under their
id, written atomically (a temp file whose name never matches an id, then a rename), and are
opened without following links and only if they are regular files.

- `ArtifactStore`: the protocol the executor and `read_artifact_tool` use (store / read / exists).
  A store may also offer `remove(ids)`, which `Agent.close()` calls for the session's artifacts when
  `artifact_cleanup_on_session_end` is on (CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END).
- `LocalArtifactStore`: the default of an agent without a server: files in
  `runtime_settings().artifact_dir` (`var/agent-artifacts` unless configured), their metadata in
  a sidecar `<id>.meta.json` beside each (a name no id matches). A server passes its own store,
  e.g. ctxlens's `pipeline.artifacts.store.ServerArtifactStore` (a row per artifact).
- Helpers both use: `validate_artifact_id`, `prepare_sandbox`, `sandbox_path`, `write_atomically`,
  `has_file`, `open_regular_file`, `storage_error`, `redact_paths`.
- Errors: `ArtifactError` > `InvalidArtifactId`, `ArtifactNotFound`, `ArtifactStorageError`;
  their messages are safe to show (no path).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

from pipeline.runtime.settings import runtime_settings

logger = logging.getLogger(__name__)

ARTIFACT_ID_RE = re.compile(r"\Aartifact_[0-9a-f]{16,64}\Z")
TEMP_PREFIX = ".tmp-"  # never matches ARTIFACT_ID_RE, so a half-written file is never served
SHORT_ID_HEX = 32  # the first 32 hex digits of the sha256; all 64 if two contents share them
META_SUFFIX = ".meta.json"  # LocalArtifactStore's sidecar; `artifact_….meta.json` never matches an id
REDACTED = "<artifact sandbox>"
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


@runtime_checkable
class ArtifactStore(Protocol):
    """Keeps large tool results and gives them back by id. Errors are ArtifactError subclasses."""

    def store(
        self, data: bytes, *, summary: str = "", mime: str = "text/plain",
        token_count: int | None = None, conversation: Any = None,
    ) -> str:
        """Keep `data` and return its artifact id (the same content → the same id).

        `conversation` is whatever the caller passed as ExecutionContext.conversation (a server
        links the artifact to it). Raises ArtifactStorageError, e.g. when the disk is full.
        """
        ...

    def read(self, artifact_id: str, *, max_bytes: int | None = None) -> ArtifactContent:
        """The artifact's content (at most `max_bytes` of it); InvalidArtifactId or ArtifactNotFound."""
        ...

    def exists(self, artifact_id: str) -> bool:
        """Whether `artifact_id` can still be read (known and not expired)."""
        ...


def validate_artifact_id(value: object) -> str:
    """The id itself if it is exactly `artifact_<16-64 lowercase hex>`, else InvalidArtifactId.

    No decoding or normalisation happens first: percent-encoded, fullwidth or other look-alike
    characters are simply not in the allowed alphabet.
    """
    if not isinstance(value, str) or not ARTIFACT_ID_RE.match(value):
        raise InvalidArtifactId("invalid artifact id: expected artifact_ followed by 16-64 hex digits")
    return value


def artifact_id_for(sha256_hex: str, *, full: bool = False) -> str:
    return f"artifact_{sha256_hex if full else sha256_hex[:SHORT_ID_HEX]}"


def prepare_sandbox(directory: Path | str) -> Path:
    """The resolved sandbox directory, created (mode 0700) when missing."""
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root.resolve()


def sandbox_path(root: Path, artifact_id: str) -> Path:
    """Where an artifact's file lives under the resolved `root`. Internal: never show it to a user."""
    path = root / validate_artifact_id(artifact_id)
    if path.parent != root:  # cannot happen for a valid id; kept as a second fence
        raise InvalidArtifactId("invalid artifact id")
    return path


def storage_error(exc: OSError) -> ArtifactStorageError:
    """An OSError as a message without a path."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ArtifactStorageError("artifact storage is full: free space or lower CTXLENS_ARTIFACT_MAX_TOTAL_BYTES")
    return ArtifactStorageError(f"artifact could not be written ({errno_name(exc)})")


def errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "I/O error")


def write_atomically(root: Path, name: str, data: bytes) -> None:
    """Write to a temp file in `root`, fsync, then rename over `name`; no temp file survives a failure."""
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


def has_file(path: Path, size: int) -> bool:
    """A regular file (not a link) of exactly `size` bytes is at `path`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def open_regular_file(root: Path, aid: str) -> BinaryIO:
    """The sandbox file of a valid id, opened without following a symlink and refused unless it
    is a regular file. O_NONBLOCK keeps a FIFO planted under an artifact's name from blocking
    the open; it is cleared again before anything is read."""
    try:
        fd = os.open(sandbox_path(root, aid), os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except OSError:
        raise ArtifactNotFound(f"{aid} has no readable content") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ArtifactNotFound(f"{aid} has no readable content")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def redact_paths(message: str, roots: Iterable[Path | str | None]) -> str:
    """`message` with every sandbox root in it (as given and resolved) replaced by a placeholder."""
    names: set[str] = set()
    for root in roots:
        if root:
            names.update({str(root), str(Path(root).resolve())})
    for name in sorted(names - {"", ".", "/"}, key=len, reverse=True):
        message = message.replace(name, REDACTED)
    return message


@dataclass
class _Meta:
    sha256: str
    size: int
    mime: str
    summary: str
    token_count: int | None
    conversation: str | None
    created_at: float
    expires_at: float | None


class LocalArtifactStore:
    """Artifacts as files in a directory, each with a JSON sidecar; for an agent without a server.

    `directory` defaults to `runtime_settings().artifact_dir`, `ttl_hours` to its
    `artifact_ttl_hours`. A store of content already kept pushes its expiry out. Expired files
    are not served; `remove_expired()` deletes them (call it now and then, e.g. at start-up).
    """

    def __init__(
        self, directory: Path | str | None = None, *, ttl_hours: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._directory = Path(directory) if directory is not None else None
        self._ttl_hours = ttl_hours
        self._clock = clock

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else runtime_settings().artifact_dir

    def _root(self) -> Path:
        return prepare_sandbox(self.directory)

    def _meta(self, root: Path, aid: str) -> _Meta | None:
        try:
            return _Meta(**json.loads((root / f"{aid}{META_SUFFIX}").read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def store(
        self, data: bytes, *, summary: str = "", mime: str = "text/plain",
        token_count: int | None = None, conversation: Any = None,
    ) -> str:
        data = bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        now = self._clock()
        ttl = runtime_settings().artifact_ttl_hours if self._ttl_hours is None else self._ttl_hours
        try:
            root = self._root()
            aid = artifact_id_for(sha)
            old = self._meta(root, aid)
            if old is not None and old.sha256 != sha:
                aid, old = artifact_id_for(sha, full=True), self._meta(root, artifact_id_for(sha, full=True))
            if not has_file(root / aid, len(data)):
                write_atomically(root, aid, data)
            meta = _Meta(
                sha256=sha, size=len(data), mime=mime, summary=(old.summary if old else "") or summary,
                token_count=old.token_count if old and old.token_count is not None else token_count,
                conversation=(old.conversation if old else None) or (conversation if isinstance(conversation, str) else None),
                created_at=old.created_at if old else now,
                expires_at=now + ttl * 3600,
            )
            write_atomically(root, f"{aid}{META_SUFFIX}", json.dumps(asdict(meta)).encode())
        except OSError as exc:
            logger.warning("storing an artifact failed: %s", errno_name(exc))
            raise storage_error(exc) from None
        return aid

    def _live_meta(self, aid: str) -> tuple[Path, _Meta]:
        root = self._root()
        meta = self._meta(root, aid)
        if meta is None or (meta.expires_at is not None and meta.expires_at <= self._clock()):
            raise ArtifactNotFound(f"{aid} does not exist or has expired")
        return root, meta

    def read(self, artifact_id: str, *, max_bytes: int | None = None) -> ArtifactContent:
        aid = validate_artifact_id(artifact_id)
        root, meta = self._live_meta(aid)
        with open_regular_file(root, aid) as fh:
            data = fh.read() if max_bytes is None else fh.read(max_bytes)
        if max_bytes is None and hashlib.sha256(data).hexdigest() != meta.sha256:
            raise ArtifactError(f"{aid} failed its integrity check")
        return ArtifactContent(artifact_id=aid, data=data, size=meta.size, mime=meta.mime, summary=meta.summary)

    def exists(self, artifact_id: str) -> bool:
        try:
            self._live_meta(validate_artifact_id(artifact_id))
        except ArtifactError:
            return False
        return True

    def remove(self, artifact_ids: Iterable[str]) -> int:
        """Delete these artifacts (file and sidecar) now, e.g. at the end of the session that stored
        them (Agent.close); invalid ids are skipped. The number deleted."""
        root, removed = self._root(), 0
        for aid in set(artifact_ids):
            if not isinstance(aid, str) or not ARTIFACT_ID_RE.match(aid):
                continue
            sidecar = root / f"{aid}{META_SUFFIX}"
            existed = sidecar.exists()
            (root / aid).unlink(missing_ok=True)
            sidecar.unlink(missing_ok=True)
            removed += existed
        return removed

    def remove_expired(self) -> int:
        """Delete expired artifacts (file and sidecar); the number deleted."""
        root, removed = self._root(), 0
        for sidecar in root.glob(f"artifact_*{META_SUFFIX}"):
            aid = sidecar.name.removesuffix(META_SUFFIX)
            if ARTIFACT_ID_RE.match(aid) and not self.exists(aid):
                (root / aid).unlink(missing_ok=True)
                sidecar.unlink(missing_ok=True)
                removed += 1
        return removed
