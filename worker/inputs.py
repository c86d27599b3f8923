"""A job's model and dataset on this host: read in place from a local store, or fetched from an object
store into a cache shared by the worker processes of the host.

    <cache>/entries/<sha256>/      the files of one model's or dataset's folder, as stored
    <cache>/entries/<sha256>.pin   held shared (flock) while a job reads the entry, exclusively to evict it
    <cache>/locks/<sha256>.lock    one process downloads a given entry; the others wait and find it there
    <cache>/incoming/              downloads in progress, renamed into `entries/` once whole

Entries are keyed by the upload's SHA-256, so a second job on the same bytes, whichever row holds
them, downloads nothing. The cache is bounded in bytes: after each download the least recently used
entries that no job is reading are removed (an entry's mtime is its last use).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from jobs import storage
from jobs.storage import Store

# A download of several GB may hold a key's lock this long (seconds) before the others stop waiting.
DOWNLOAD_WAIT_SECONDS = 3600.0


@dataclass(frozen=True)
class StoredInput:
    label: str  # "model" or "dataset", for the job's events
    key: str
    sha256: str


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _entry_bytes(entry: Path) -> int:
    return sum(path.stat().st_size for path in entry.rglob("*") if path.is_file())


class InputCache:
    def __init__(self, store: Store, directory: Path, max_bytes: int) -> None:
        self.store = store
        self.entries = directory / "entries"
        self.locks = directory / "locks"
        self.incoming = directory / "incoming"
        self.max_bytes = max_bytes
        for folder in (self.entries, self.locks, self.incoming):
            folder.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def use(self, item: StoredInput) -> Iterator[tuple[Path, int | None]]:
        """The local path of `item`'s object while the context lasts, and the bytes downloaded for it
        (None: a cache hit)."""
        entry = self.entries / item.sha256
        with (self.entries / f"{item.sha256}.pin").open("a") as pin:
            fcntl.flock(pin, fcntl.LOCK_SH)  # an eviction under way ends before this returns
            try:
                with FileLock(self.locks / f"{item.sha256}.lock", timeout=DOWNLOAD_WAIT_SECONDS):
                    downloaded = None if entry.is_dir() else self._download(item, entry)
                    os.utime(entry)
                if downloaded is not None:
                    self.evict()
                yield entry / item.key.rsplit("/", 1)[-1], downloaded
            finally:
                fcntl.flock(pin, fcntl.LOCK_UN)

    def _download(self, item: StoredInput, entry: Path) -> int:
        prefix = storage.folder(item.key)
        staging = Path(tempfile.mkdtemp(dir=self.incoming))
        try:
            size = 0
            for stored in self.store.list(prefix):  # a model's external data files come with it
                target = staging / stored.key.removeprefix(prefix)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.store.fetch(stored.key, target)
                size += stored.size
            os.rename(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return size

    def evict(self) -> None:
        """Remove least recently used entries, skipping those a job reads, until the cache fits."""
        with FileLock(self.locks / "evict.lock", timeout=DOWNLOAD_WAIT_SECONDS):
            entries = sorted(
                (path for path in self.entries.iterdir() if path.is_dir()), key=lambda p: p.stat().st_mtime
            )
            sizes = {entry: _entry_bytes(entry) for entry in entries}
            total = sum(sizes.values())
            for entry in entries:
                if total <= self.max_bytes:
                    return
                with (self.entries / f"{entry.name}.pin").open("a") as pin:
                    try:
                        fcntl.flock(pin, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a job is reading it
                    trash = self.incoming / f"evicted-{uuid.uuid4().hex}"
                    os.rename(entry, trash)
                    fcntl.flock(pin, fcntl.LOCK_UN)
                shutil.rmtree(trash, ignore_errors=True)
                total -= sizes[entry]


class JobInputs:
    """A job's model and dataset, fetched when `fetch` is called and held until the context ends."""

    def __init__(self, store: Store, cache_dir: Path, max_bytes: int, *items: StoredInput) -> None:
        self.store, self.cache_dir, self.max_bytes, self.items = store, cache_dir, max_bytes, items
        self.held = ExitStack()

    def fetch(self, log: Callable[[str], None]) -> list[Path]:
        paths = []
        for item in self.items:
            local = self.store.local_path(item.key)
            if local is not None:
                paths.append(local)
                continue
            cache = InputCache(self.store, self.cache_dir, self.max_bytes)
            path, downloaded = self.held.enter_context(cache.use(item))
            if downloaded is None:
                log(f"{item.label}: cache hit (sha256 {item.sha256[:12]}), nothing downloaded")
            else:
                log(f"{item.label}: downloaded {_megabytes(downloaded)} into this worker's cache")
            paths.append(path)
        return paths

    def __enter__(self) -> JobInputs:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.held.close()


@contextmanager
def checkout(store: Store, key: str, scratch: Path) -> Iterator[Path]:
    """A local path of a stored object for a check that reads it once (validation): the file itself on
    a local store, else a download removed afterwards."""
    local = store.local_path(key)
    if local is not None:
        yield local
        return
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        path = Path(directory) / key.rsplit("/", 1)[-1]
        store.fetch(key, path)
        yield path


def check_in(store: Store, path: Path, key: str) -> None:
    """Store what a check rewrote beside a checked-out `path` (an unpacked model archive) under `key`'s
    folder; nothing on a local store, where the check wrote in place."""
    if store.local_path(key) is not None:
        return
    prefix = storage.folder(key)
    for file in sorted(path.parent.rglob("*")):
        if file.is_file():
            store.put_file(file, prefix + file.relative_to(path.parent).as_posix())
