"""Where files live under the storage root, and how they get there safely.

    <root>/<project>/models/<model>/model.onnx
    <root>/<project>/datasets/<dataset>/data.npz     (or images.zip)
    <root>/<project>/jobs/<job>/<artifact name>

Rows store paths relative to the root, so the root can move (or become an S3 prefix) without
rewriting the database. Files are written under a temporary name and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

CHUNK = 1024 * 1024


def model_path(project_id: uuid.UUID, model_id: uuid.UUID) -> str:
    return f"{project_id}/models/{model_id}/model.onnx"


def dataset_path(project_id: uuid.UUID, dataset_id: uuid.UUID) -> str:
    return f"{project_id}/datasets/{dataset_id}/data.npz"


def image_archive_path(project_id: uuid.UUID, dataset_id: uuid.UUID) -> str:
    return f"{project_id}/datasets/{dataset_id}/images.zip"


def job_dir(project_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return f"{project_id}/jobs/{job_id}"


def resolve(root: Path, relative: str) -> Path:
    """Absolute path of a stored file; refuses anything that would leave the root."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ValueError(f"path escapes the storage root: {relative}")
    return path


def store_file(root: Path, source: Path, relative: str) -> tuple[int, str]:
    """Copy `source` to `relative` atomically; returns (size in bytes, SHA-256 hex)."""
    target = resolve(root, relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    digest = hashlib.sha256()
    size = 0
    with source.open("rb") as src, partial.open("wb") as dst:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(partial, target)
    return size, digest.hexdigest()


def remove_tree(root: Path, relative: str) -> None:
    shutil.rmtree(resolve(root, relative), ignore_errors=True)
