"""timing_cache: one file per (GPU, TensorRT version); concurrent updates from two processes lose nothing."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from quantcore.tensorrt import timing_cache

UPDATES = 25  # per process; each is a read-merge-write that would lose entries without the lock


def combine_json(existing: bytes | None, new: bytes) -> bytes:
    """Stand-in for ITimingCache.combine: a union of entries (the real one needs a GPU)."""
    entries = json.loads(existing) if existing else []
    return json.dumps(entries + json.loads(new)).encode()


def _worker(path: str, tag: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    for i in range(UPDATES):
        timing_cache.update(Path(path), json.dumps([f"{tag}-{i}"]).encode(), combine_json)


def test_cache_file_per_gpu_and_version(tmp_path: Path) -> None:
    a = timing_cache.cache_path(tmp_path, gpu_name="NVIDIA A100-SXM4-80GB", tensorrt_version="10.9.0.34")
    b = timing_cache.cache_path(tmp_path, gpu_name="NVIDIA L4", tensorrt_version="10.9.0.34")
    c = timing_cache.cache_path(tmp_path, gpu_name="NVIDIA L4", tensorrt_version="11.0.0")
    assert a.name == "nvidia-a100-sxm4-80gb--trt10.9.0.34.timing-cache"
    assert len({a, b, c}) == 3 and all(p.parent == tmp_path for p in (a, b, c))


def test_load_missing_then_update(tmp_path: Path) -> None:
    path = tmp_path / "caches" / "gpu--trt10.timing-cache"
    assert timing_cache.load(path) is None
    assert timing_cache.update(path, b'["a"]', combine_json) == b'["a"]'
    timing_cache.update(path, b'["b"]', combine_json)
    assert json.loads(timing_cache.load(path)) == ["a", "b"]


def test_two_processes_update_concurrently_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "shared.timing-cache"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [context.Process(target=_worker, args=(str(path), tag, start)) for tag in ("p1", "p2")]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    entries = json.loads(path.read_bytes())  # parses: never a half-written file
    assert sorted(entries) == sorted(f"{tag}-{i}" for tag in ("p1", "p2") for i in range(UPDATES))
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no temporary file left behind
