"""Measured CPU timings kept between runs, so that a rerun of the same comparison measures nothing.

One JSON file, ``cpu-timings.json``, in a directory the caller chooses (the service: one under its var
directory, shared by its workers). An entry's key is the SHA-256 of what the timing depends on: the CPU
(model name and flags, ``quantcore.runtime.cpu_features``), the ONNX Runtime version, the intra-op
threads, the batch sizes, and the signatures of the models compared (``paired_latency.signature``).
Its value is what the ``Timer`` measured, summarized: per batch size, per model, a ``Timing`` or the
message ONNX Runtime refused it with.

Concurrent workers: every read-modify-write holds ``cpu-timings.json.lock`` (``filelock``, an OS
lock released when its process dies), and the file is replaced whole (``quantcore.atomic``), so a
reader never sees half of one. A file that does not parse is treated as empty and rewritten: timings
are only ever a cache. At most ``MAX_ENTRIES`` entries are kept, the oldest written dropped first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnxruntime as ort
from filelock import FileLock

from quantcore import atomic
from quantcore.evaluate.paired_latency import Timing
from quantcore.runtime.cpu_features import cpu_flags, cpu_model

CACHE_FILE = "cpu-timings.json"
FORMAT = 1
MAX_ENTRIES = 20_000  # a few MB of JSON; far more than the regions of the models one service sees
LOCK_TIMEOUT_S = 60.0

# per batch size, per model compared: its timing, or why ONNX Runtime did not run it
Measured = dict[int, list[Timing | str]]


def timing_key(signatures: Sequence[str], batch_sizes: Sequence[int], threads: int) -> str:
    """The cache key of timing ``signatures``' models at ``batch_sizes`` with ``threads`` on this machine."""
    flags = " ".join(sorted(cpu_flags() or ()))
    text = json.dumps(
        [FORMAT, cpu_model(), flags, ort.__version__, threads, list(batch_sizes), list(signatures)], sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _encode(measured: Measured) -> dict[str, list[Any]]:
    return {str(b): [m if isinstance(m, str) else m.to_dict() for m in models] for b, models in measured.items()}


def _decode(stored: dict[str, list[Any]]) -> Measured:
    return {int(b): [m if isinstance(m, str) else Timing.from_dict(m) for m in models] for b, models in stored.items()}


class TimingCache:
    """The cache file in ``directory`` (created on first write)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / CACHE_FILE
        self.lock = FileLock(str(self.path) + ".lock", timeout=LOCK_TIMEOUT_S)

    def _entries(self) -> dict[str, Any]:
        try:
            document = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            return {}
        entries = document.get("entries")
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> Measured | None:
        """The timings stored under ``key``, None when there are none (or they do not parse)."""
        if not self.path.exists():
            return None
        with self.lock:
            stored = self._entries().get(key)
        try:
            return None if stored is None else _decode(stored)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put(self, key: str, measured: Measured) -> None:
        """Store ``measured`` under ``key``, keeping what other processes stored meanwhile."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            entries = self._entries()
            entries.pop(key, None)  # re-inserted last: the newest
            entries[key] = _encode(measured)
            while len(entries) > MAX_ENTRIES:
                entries.pop(next(iter(entries)))
            atomic.write_json(self.path, {"format": FORMAT, "entries": entries})
