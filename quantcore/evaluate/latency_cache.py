"""Measured CPU timings kept between runs, so that a rerun of the same comparison measures nothing.

One JSON file, ``cpu-timings.json``, in a directory the caller chooses (the service: one under its var
directory, shared by its workers). An entry's key is the SHA-256 of what the timing depends on: the CPU
(model name and flags, ``quantcore.runtime.cpu_features``), the ONNX Runtime version, the intra-op
threads, the batch sizes, and the signatures of the models compared (``paired_latency.signature``).
Its value is what the ``Timer`` measured, summarized: per batch size, per model, a ``Timing`` or the
message ONNX Runtime refused it with; or, under a key of profiled models (their signatures behind
``PROFILE``), what the ``Profiler`` found: per model, per batch size a ``NodeProfile``, or the refusal.

Concurrent workers: every read-modify-write holds ``cpu-timings.json.lock`` (``filelock``, an OS
lock released when its process dies), and the file is replaced whole (``quantcore.atomic``), so a
reader never sees half of one. A file that does not parse is treated as empty and rewritten: timings
are only ever a cache. At most ``MAX_ENTRIES`` entries and ``MAX_BYTES`` of JSON are kept (the file is
rewritten whole at every store), the oldest written dropped first.
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
from quantcore.evaluate.node_profile import NodeProfile
from quantcore.evaluate.paired_latency import Timing
from quantcore.runtime.cpu_features import cpu_flags, cpu_model

CACHE_FILE = "cpu-timings.json"
# the entries' layout and meaning (5: a timing's span, min_ms and high_ms): another is read as empty
FORMAT = 5
MAX_ENTRIES = 20_000  # far more than the models one service times
MAX_BYTES = 16 * 2**20  # of JSON in all: a timing takes ~0.3 KB, a node profile ~20 KB per model and batch size
LOCK_TIMEOUT_S = 60.0
PROFILE = "node profile"  # the first of a profile key's signatures: no pair of timed models collides with it

# per batch size, per model compared: its timing, or why ONNX Runtime did not run it
Measured = dict[int, list[Timing | str]]
# per batch size one model's node profile, or why ONNX Runtime did not profile it
Profiles = dict[int, NodeProfile] | str


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

    def _read(self, key: str) -> Any:
        if not self.path.exists():
            return None
        with self.lock:
            return self._entries().get(key)

    def _write(self, key: str, stored: Any) -> None:
        """Store ``stored`` (plain JSON) under ``key``, keeping what other processes stored meanwhile."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            entries = self._entries()
            entries.pop(key, None)  # re-inserted last: the newest
            entries[key] = stored
            sizes = {k: len(json.dumps(v)) for k, v in entries.items()}
            total = sum(sizes.values())
            while len(entries) > 1 and (len(entries) > MAX_ENTRIES or total > MAX_BYTES):
                total -= sizes[oldest := next(iter(entries))]
                entries.pop(oldest)
            atomic.write_json(self.path, {"format": FORMAT, "entries": entries})

    def get(self, key: str) -> Measured | None:
        """The timings stored under ``key``, None when there are none (or they do not parse)."""
        stored = self._read(key)
        try:
            return None if stored is None else _decode(stored)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put(self, key: str, measured: Measured) -> None:
        """Store ``measured`` under ``key``."""
        self._write(key, _encode(measured))

    def get_profiles(self, key: str) -> list[Profiles] | None:
        """The node profiles (or refusals) stored under ``key``, None when there are none (or they do not parse)."""
        stored = self._read(key)
        try:
            if stored is None:
                return None
            return [
                p if isinstance(p, str) else {int(b): NodeProfile.from_dict(n) for b, n in p.items()} for p in stored
            ]
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put_profiles(self, key: str, profiles: Sequence[Profiles]) -> None:
        """Store ``profiles`` under ``key`` (``timing_key`` of ``[PROFILE, the models' signatures...]``)."""
        self._write(key, [p if isinstance(p, str) else {str(b): n.to_dict() for b, n in p.items()} for p in profiles])
