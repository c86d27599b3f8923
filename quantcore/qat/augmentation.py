"""Random flips and shifted crops of QAT's image training batches (``QatAugment``).

Image inputs only: every input an array (N, C, H, W) of floats with C ≤ 4 channels (NCHW: gray, RGB or
RGBA); anything else is refused (``image_problem``), because a flip or crop along the wrong axes (an NHWC
layout, a sequence) would feed the model samples it was never meant to see. Per sample, one draw serves all
its inputs:

    crop_padding p > 0: x zero-padded by p on both sides of H and W, then the H x W window at (dy, dx), each
                        uniform in 0..2p (a shift of up to ±p pixels; dy = dx = p is the sample unchanged)
    flip:               x[..., ::-1] (mirrored along W) with probability 1/2, after the crop

The draws come from a torch generator of their own, seeded from the run's seed, whose state the
checkpoint keeps, so a resumed run augments as one that never stopped. The FP32 targets of an augmented
batch are the teacher's outputs on that batch (``quantcore.qat.training``), not the stored ones.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from quantcore.config.qat import QatAugment

MAX_CHANNELS = 4  # NCHW images: gray, RGB, RGBA


def image_problem(inputs: Mapping[str, np.ndarray]) -> str | None:
    """Why ``inputs`` ({name: (N, ...)}) are not all NCHW float images with C ≤ 4 (None: they are)."""
    for name, value in inputs.items():
        if value.ndim != 4 or value.dtype.kind != "f" or value.shape[1] > MAX_CHANNELS:
            return (
                f"input {name!r} is {value.dtype} {list(value.shape[1:])} per sample; augmentation flips and "
                f"crops images only: NCHW floats with at most {MAX_CHANNELS} channels"
            )
    return None


class Augmentation:
    """``apply(batch)`` → the batch ({name: (B, C, H, W)}) with each sample flipped and cropped per ``augment``."""

    def __init__(self, augment: QatAugment, seed: int) -> None:
        self.augment = augment
        # its own stream: the batch order draws from another generator seeded with ``seed`` itself
        self.generator = torch.Generator().manual_seed(seed + 1)

    def apply(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        count = len(next(iter(batch.values())))
        pad = self.augment.crop_padding
        # (B, 2) window offsets (dy, dx) into the padded sample; p, p where nothing is cropped
        offsets = torch.randint(0, 2 * pad + 1, (count, 2), generator=self.generator).numpy()
        flips = (torch.rand(count, generator=self.generator) < 0.5).numpy() & self.augment.flip  # (B,) bool
        augmented = {}
        for name, value in batch.items():
            height, width = value.shape[2:]
            padded = np.pad(value, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
            out = np.stack([padded[i, :, dy : dy + height, dx : dx + width] for i, (dy, dx) in enumerate(offsets)])
            out[flips] = out[flips, ..., ::-1]
            augmented[name] = np.ascontiguousarray(out)
        return augmented

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
