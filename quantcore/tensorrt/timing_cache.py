"""TensorRT timing caches persisted on disk, one file per (GPU model, TensorRT version), shared by jobs.

A timing cache records which kernel tactic won for each layer configuration; reusing it turns a
minutes-long build into seconds, but it is only valid on the same GPU model and TensorRT version, hence
the file name ``<gpu>--trt<version>.timing-cache`` under one directory.

Concurrency: several workers may build at once. Readers take a shared ``fcntl.flock`` on a sibling
``.lock`` file; an update takes the exclusive lock, reads the current file, merges the new cache into
it (``combine``, TensorRT's ``ITimingCache.combine`` in practice) and writes the result atomically
(temporary file + rename), so no update is lost and no reader sees a half-written file. The lock is on
a separate file because the data file is replaced by rename. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from quantcore import atomic

SUFFIX = ".timing-cache"

Combine = Callable[[bytes | None, bytes], bytes]  # (cache on disk or None, new cache) -> merged cache


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def cache_path(directory: str | Path, *, gpu_name: str, tensorrt_version: str) -> Path:
    """``directory/<gpu>--trt<version>.timing-cache``, e.g. ``nvidia-a100-sxm4-80gb--trt10.9.0.timing-cache``."""
    return Path(directory) / f"{_slug(gpu_name)}--trt{_slug(tensorrt_version)}{SUFFIX}"


@contextlib.contextmanager
def locked(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold ``flock`` on ``<path>.lock`` (shared or exclusive) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def load(path: Path) -> bytes | None:
    """The cache's bytes, or None if there is no cache yet."""
    with locked(path, exclusive=False):
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None


def update(path: Path, new: bytes, combine: Combine) -> bytes:
    """Merge ``new`` into the cache on disk under the exclusive lock and save it; returns what was saved."""
    with locked(path, exclusive=True):
        try:
            existing: bytes | None = path.read_bytes()
        except FileNotFoundError:
            existing = None
        merged = combine(existing, new)
        atomic.write_bytes(path, merged)
        return merged
