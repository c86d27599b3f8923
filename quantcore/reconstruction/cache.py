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
    """name → (N, ...) float32 array; ``kind`` is "memory" or "disk"."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], budget: int) -> None:
        total = sum(4 * math.prod(shape) for shape in shapes.values())
        self.nbytes = total
        self.kind = "memory" if total <= budget else "disk"
        self._directory = tempfile.TemporaryDirectory(prefix="quantcore-recon-") if self.kind == "disk" else None
        self.arrays: dict[str, np.ndarray] = {}
        for i, (name, shape) in enumerate(shapes.items()):
            if self._directory is None:
                self.arrays[name] = np.empty(shape, np.float32)
            else:
                path = Path(self._directory.name) / f"{i}.f32"
                self.arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def close(self) -> None:
        self.arrays.clear()
        if self._directory is not None:
            self._directory.cleanup()
