"""Where files live in the store, and the one interface both stores implement.

    <project>/models/<model>/model.onnx
    <project>/datasets/<dataset>/data.npz     (or images.zip)
    <project>/jobs/<job>/<artifact name>
    <project>/jobs/<job>/.staging/<attempt>/<artifact name>   (until the job's end is committed)
    .uploads/...                                              (an upload still streaming)

Rows store these keys, relative to the store's root, so the root can move (a local directory or an
S3 prefix) without rewriting the database. `QUANT_STORAGE_URL` picks the store (`open_store`): unset
or `file://...`, the local filesystem (`jobs.local_store`); `s3://bucket/prefix`, an S3-compatible
object store (`jobs.object_store`), so that the API, CPU workers and GPU workers need no shared disk.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.config import Settings

CHUNK = 1024 * 1024
UPLOADS = ".uploads"
STAGING = ".staging"


def model_path(project_id: uuid.UUID, model_id: uuid.UUID) -> str:
    return f"{project_id}/models/{model_id}/model.onnx"


def dataset_path(project_id: uuid.UUID, dataset_id: uuid.UUID) -> str:
    return f"{project_id}/datasets/{dataset_id}/data.npz"


def image_archive_path(project_id: uuid.UUID, dataset_id: uuid.UUID) -> str:
    return f"{project_id}/datasets/{dataset_id}/images.zip"


def job_dir(project_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return f"{project_id}/jobs/{job_id}"


def staging_key(project_id: uuid.UUID, job_id: uuid.UUID, attempt: int, name: str) -> str:
    """Where an attempt writes an artifact before the job's end makes it visible (`Store.move`)."""
    return f"{job_dir(project_id, job_id)}/{STAGING}/{attempt}/{name}"


def folder(key: str) -> str:
    """The folder prefix of a key (`a/b/c.onnx` → `a/b/`): a model's or dataset's files live together."""
    return key.rsplit("/", 1)[0] + "/"


def resolve(root: Path, relative: str) -> Path:
    """Absolute path of a key under a local root; refuses anything that would leave the root."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ValueError(f"path escapes the storage root: {relative}")
    return path


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    modified: float  # seconds since the epoch


class StagedUpload(ABC):
    """An upload being received: written chunk by chunk, then committed under a key or aborted.

    `path` is a local copy of what was received (the API inspects archives' listings there). The
    caller calls `send` from a thread whenever `pending` is true, so network writes stay off the event
    loop and at most one part is held in memory."""

    path: Path

    @abstractmethod
    def write(self, data: bytes) -> None: ...

    def pending(self) -> bool:
        return False

    def send(self) -> None:  # noqa: B027 - only stores that upload in parts have anything to send
        """Push buffered bytes to the store (blocking)."""

    @abstractmethod
    def finish(self) -> None:
        """Everything is received: flush it (blocking)."""

    @abstractmethod
    def commit(self, key: str) -> None:
        """Make the upload the object at `key` (blocking); the local copy is gone afterwards."""

    @abstractmethod
    def abort(self) -> None:
        """Forget the upload and its local copy (blocking); safe to call twice."""


class Store(ABC):
    """Objects under keys. Writes are whole or absent: a reader never sees a partial object."""

    def local_path(self, key: str) -> Path | None:
        """The object's path when it is a file on this host (read in place), else None."""
        return None

    @abstractmethod
    def begin_upload(self) -> StagedUpload: ...

    @abstractmethod
    def put_file(self, source: Path, key: str) -> tuple[int, str]:
        """Store a local file under `key`; returns (size in bytes, SHA-256 hex)."""

    @abstractmethod
    def fetch(self, key: str, target: Path) -> None:
        """Download the object into the local file `target`."""

    @abstractmethod
    def read_range(self, key: str, start: int, end: int) -> Iterator[bytes]:
        """Bytes [start, end) of the object, in chunks of at most `CHUNK`."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's size; FileNotFoundError when there is none."""

    @abstractmethod
    def move(self, source: str, key: str) -> None:
        """Rename `source` to `key`; nothing when `source` is gone and `key` exists (a retried move)."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[StoredObject]: ...

    def read_bytes(self, key: str) -> bytes:
        return b"".join(self.read_range(key, 0, self.size(key)))

    def presign(self, key: str, *, seconds: int, filename: str, media_type: str) -> str | None:
        """A URL that serves the object without credentials for `seconds`, or None if the store has none."""
        return None

    def abort_stale_uploads(self, older_than: float) -> int:
        """Cancel uploads begun before `older_than` (epoch seconds) and never ended; returns how many."""
        return 0


def open_store(settings: Settings) -> Store:
    return _open(settings.storage_url, settings.artifact_root, settings.storage_endpoint_url, settings.var_dir)


@lru_cache(maxsize=8)
def _open(url: str | None, root: Path, endpoint_url: str | None, var_dir: Path) -> Store:
    if url is None or url.startswith("file://"):
        from jobs.local_store import LocalStore

        return LocalStore(root if url is None else Path(url.removeprefix("file://")))
    from jobs.object_store import ObjectStore

    # An upload's local copy goes to the var directory, which every host has of its own.
    return ObjectStore.from_url(url, endpoint_url=endpoint_url, scratch=var_dir / "scratch")
