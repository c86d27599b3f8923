"""The per-block sample cache: block inputs (quantized model, and FP32 model for QDrop) and FP32
targets for the reconstruction samples, filled from ONNX Runtime one batch at a time.

Its unit is a sample where every tensor of the block holds its samples on axis 0, and otherwise a whole
ONNX Runtime run (``per_run``): a sequence-first transformer's (L, N, D) activations, or a shape computed
inside the graph, cannot be cut into samples, so each step and each loss term reads one run's tensors as
the graph computed them. Arrays live in memory while the block's total stays within ``budget`` bytes;
beyond it they are memory-mapped files in a temporary directory removed by ``close`` (so a large block
costs disk, not RAM). One block's cache exists at a time.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch


class BlockCache:
    """name → (units, ...) array of the dtype given (float32 activations; integer tensors such as a shape
    computed outside the block keep theirs); ``kind`` is "memory" or "disk"; ``units`` samples, or runs
    where ``per_run``."""

    def __init__(
        self, specs: dict[str, tuple[tuple[int, ...], np.dtype]], budget: int, *, per_run: bool = False
    ) -> None:
        total = sum(np.dtype(dtype).itemsize * math.prod(shape) for shape, dtype in specs.values())
        self.nbytes, self.per_run = total, per_run
        self.units = next(iter(specs.values()))[0][0]
        self.kind = "memory" if total <= budget else "disk"
        self._directory = tempfile.TemporaryDirectory(prefix="quantcore-recon-") if self.kind == "disk" else None
        self.arrays: dict[str, np.ndarray] = {}
        for i, (name, (shape, dtype)) in enumerate(specs.items()):
            if self._directory is None:
                self.arrays[name] = np.empty(shape, dtype)
            else:
                path = Path(self._directory.name) / f"{i}.npy"
                self.arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def draw(self, generator: torch.Generator, batch: int) -> np.ndarray | int:
        """A training step's index: ``batch`` samples drawn with replacement (sorted, for memory-mapped
        reads), or one run."""
        if self.per_run:
            return int(torch.randint(self.units, (), generator=generator))
        return np.sort(torch.randint(self.units, (min(batch, self.units),), generator=generator).numpy())

    def chunks(self, chunk: int) -> Iterator[tuple[np.ndarray | int, int]]:
        """Every unit once, as (index, units in it): ``chunk`` samples at a time, or a run at a time."""
        if self.per_run:
            yield from ((run, 1) for run in range(self.units))
            return
        for start in range(0, self.units, chunk):
            index = np.arange(start, min(self.units, start + chunk))
            yield index, len(index)

    def close(self) -> None:
        self.arrays.clear()
        if self._directory is not None:
            self._directory.cleanup()
