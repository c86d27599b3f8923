"""QAT's resume checkpoint: what the training loop needs to go on after step k exactly as if it had not
stopped (a worker killed mid-training resumes from its last checkpoint, not from the start).

``Checkpointing(path, resume_from, key)``: the loop writes ``path`` every ``QatConfig.checkpoint_every``
steps (whole or not at all, ``quantcore.atomic``) and removes it when training ends; at its start it reads
``resume_from`` when that file exists and holds ``key`` (the run's fingerprint of model, calibration data and
config, ``quantcore.export.checkpoint.fingerprint``), and ignores it otherwise. The file holds tensors and
plain values only (read with ``torch.load(weights_only=True)``): the module's parameters, Adam's state,
the batch order's generator state and pending indices, the augmentation's generator state (with
``QatConfig.augment``), the epoch and step reached, the running loss of the
epoch, the finished epochs' reports, and the best epoch with its parameters.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quantcore import atomic

FILE = "qat.checkpoint.pt"


@dataclass(frozen=True)
class Checkpointing:
    path: Path  # written during training, removed at its end
    resume_from: Path | None  # read at the start (usually ``path`` of an earlier attempt)
    key: str  # the run's fingerprint: a checkpoint holding another key is ignored


class BatchOrder:
    """Endless sorted index batches of ``size``: successive seeded permutations of range(count), cut in order."""

    def __init__(self, count: int, size: int, seed: int) -> None:
        self.count, self.size = count, size
        self.generator = torch.Generator().manual_seed(seed)
        self.pending = np.empty(0, np.int64)

    def next(self) -> np.ndarray:
        while len(self.pending) < self.size:
            self.pending = np.concatenate([self.pending, torch.randperm(self.count, generator=self.generator).numpy()])
        batch, self.pending = self.pending[: self.size], self.pending[self.size :]
        return np.sort(batch)

    def state(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state(), "pending": torch.from_numpy(self.pending.copy())}

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])
        self.pending = state["pending"].numpy().astype(np.int64)


@dataclass
class Position:
    """Where training stands: ``step`` steps of epoch ``epoch`` done (1-based epochs), their loss sum,
    the finished epochs' reports (``EpochReport`` as dicts), the best held-out SQNR so far with its
    epoch (0: the post-training model) and parameters (None: the post-training model's), and where a
    resumed run went on from."""

    epoch: int = 1
    step: int = 0
    total: float = 0.0
    epochs: list[dict[str, Any]] = field(default_factory=list)
    best: float = float("-inf")
    best_epoch: int = 0
    best_state: dict[str, torch.Tensor] | None = None
    resumed_from: int | None = None  # the step (counted over epochs) the last resume went on from


def save(
    checkpointing: Checkpointing, position: Position, module, optimizer, order: BatchOrder, augmentation=None
) -> None:
    buffer = io.BytesIO()
    document = {
        "key": checkpointing.key,
        "position": asdict(position),
        "module": module.state(),
        "optimizer": optimizer.state_dict(),
        "order": order.state(),
        "augmentation": None if augmentation is None else augmentation.state(),
    }
    torch.save(document, buffer)
    atomic.write_bytes(checkpointing.path, buffer.getvalue())


def restore(checkpointing: Checkpointing, module, optimizer, order: BatchOrder, augmentation=None) -> Position | None:
    """The position a matching checkpoint in ``resume_from`` holds, with the module, optimizer, batch
    order and augmentation restored from it; None (nothing changed) when there is none."""
    if checkpointing.resume_from is None or not checkpointing.resume_from.is_file():
        return None
    document = torch.load(checkpointing.resume_from, map_location="cpu", weights_only=True)
    if document.get("key") != checkpointing.key:
        return None
    module.load_state(document["module"])
    optimizer.load_state_dict(document["optimizer"])
    order.restore(document["order"])
    if augmentation is not None:
        augmentation.restore(document["augmentation"])
    return Position(**document["position"])


def remove(checkpointing: Checkpointing) -> None:
    checkpointing.path.unlink(missing_ok=True)
