"""The store as a directory on this host (the embedded default, `make run`): keys are paths under
one root; every write goes to a temporary name in the same directory and is renamed into place."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from jobs.storage import CHUNK, UPLOADS, StagedUpload, Store, StoredObject, resolve


def _partial(target: Path) -> Path:
    return target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")


class LocalUpload(StagedUpload):
    def __init__(self, root: Path) -> None:
        self.root = root
        directory = root / UPLOADS
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f".upload-{uuid.uuid4().hex}.part"
        self.handle = self.path.open("wb")

    def write(self, data: bytes) -> None:
        self.handle.write(data)

    def finish(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()

    def commit(self, key: str) -> None:
        target = resolve(self.root, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.path.replace(target)

    def abort(self) -> None:
        self.handle.close()
        self.path.unlink(missing_ok=True)


class LocalStore(Store):
    def __init__(self, root: Path) -> None:
        self.root = root

    def local_path(self, key: str) -> Path:
        return resolve(self.root, key)

    def begin_upload(self) -> LocalUpload:
        return LocalUpload(self.root)

    def put_file(self, source: Path, key: str) -> tuple[int, str]:
        target = resolve(self.root, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial(target)
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

    def fetch(self, key: str, target: Path) -> None:
        shutil.copyfile(resolve(self.root, key), target)

    def read_range(self, key: str, start: int, end: int) -> Iterator[bytes]:
        with resolve(self.root, key).open("rb") as handle:
            handle.seek(start)
            remaining = end - start
            while remaining > 0 and (chunk := handle.read(min(CHUNK, remaining))):
                remaining -= len(chunk)
                yield chunk

    def size(self, key: str) -> int:
        return resolve(self.root, key).stat().st_size

    def move(self, source: str, key: str) -> None:
        target = resolve(self.root, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(resolve(self.root, source), target)
        except FileNotFoundError:
            if not target.exists():
                raise

    def delete_prefix(self, prefix: str) -> None:
        path = resolve(self.root, prefix.rstrip("/"))
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        resolve(self.root, key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        base = self.root.resolve()
        start = resolve(self.root, prefix.rstrip("/")) if prefix else base
        if not start.is_dir():
            return
        for directory, _dirs, files in os.walk(start):
            for name in files:
                path = Path(directory) / name
                try:
                    info = path.stat()
                except FileNotFoundError:  # renamed or removed while we walked
                    continue
                yield StoredObject(str(path.relative_to(base)), info.st_size, info.st_mtime)
