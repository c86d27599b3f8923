"""The per-block sample cache: block inputs (quantized model, and FP32 model for QDrop) and FP32
targets for the reconstruction samples, filled from ONNX Runtime one batch at a time.

Arrays live in memory while the block's total stays within ``budget`` bytes; beyond it they are
memory-mapped files in a temporary directory removed by ``close`` (so a large block costs disk,
not RAM). One block's cache exists at a time.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np


class BlockCache:
    """name → (N, ...) array of the dtype given (float32 activations; integer tensors such as a shape
    computed outside the block keep theirs); ``kind`` is "memory" or "disk"."""

    def __init__(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]], budget: int) -> None:
        total = sum(np.dtype(dtype).itemsize * math.prod(shape) for shape, dtype in specs.values())
        self.nbytes = total
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

    def close(self) -> None:
        self.arrays.clear()
        if self._directory is not None:
            self._directory.cleanup()
