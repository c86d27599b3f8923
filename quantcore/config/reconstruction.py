"""Options of the reconstruction stage: AdaRound, BRECQ and QDrop (``quantcore.reconstruction``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantcore.checks import require_choice, require_range
from quantcore.config.choices import MAX_RECONSTRUCTION_ITERS, RECONSTRUCTION_METHODS


@dataclass(frozen=True)
class ReconstructionConfig:
    """Learned rounding after calibration (stage ``reconstruct``, ``quantcore.reconstruction``).

    method: ``adaround`` (layer by layer, Nagel et al. 2020), ``brecq`` (block by block, Li et al. 2021,
    activation step sizes learned jointly as in MQBench's benchmark, not in a second pass as in
    BRECQ's own code), ``qdrop`` (BRECQ with activation quantization dropped
    element-wise with probability ``drop_prob``, Wei et al. 2022). iters: optimizer steps per block
    (per layer for AdaRound), so every learned weight gets ``iters`` updates whatever the method, the
    budget rule of MQBench's benchmark (its ``max_count``); a block of 2-3 layers costs fewer steps in
    all than its layers one by one. batch_size: samples per step, drawn from the first
    ``num_samples`` calibration samples.
    weight_lr: Adam step on the rounding variables V (None: ``rounding_lr``'s default); activation_lr:
    Adam step on log s of the learned activation scales. rounding_loss_weight λ, warmup (fraction of
    iters without the rounding loss), beta_start → beta_end (β annealed linearly after the warm-up).
    λ is 3, not the papers' 0.01: h(V) only ends at 0 or 1 where the regularizer's pull outweighs the
    reconstruction loss's curvature in h, about 2·s²·E[x²] per weight (s the weight step, x its input),
    against the regularizer's 8λ at β = 2. Small layers at 2 bit have curvatures of 0.1-1.3 (bench's
    `narrow` ResNet), above the papers' 8·0.01, and then stay undecided however long they train (measured
    there: 53 % of h(V) undecided after 300, 1000 and 3000 steps alike, and hardening tripling the block
    loss).
    cache_bytes: block inputs/targets are held in memory up to this size and memory-mapped from a
    temporary file beyond it. seed: sampling, dropping and everything else random. threads: torch
    intra-op threads on CPU while reconstructing (0: torch's default; 1 is fastest for small blocks on
    a shared machine).
    """

    method: str = "qdrop"
    iters: int = 2000
    batch_size: int = 32
    num_samples: int = 1024
    weight_lr: float | None = None
    activation_lr: float = 1e-3
    rounding_loss_weight: float = 3.0
    warmup: float = 0.2
    beta_start: float = 20.0
    beta_end: float = 2.0
    drop_prob: float = 0.5
    cache_bytes: int = 2**30
    seed: int = 0
    threads: int = 0

    def __post_init__(self) -> None:
        require_choice("reconstruction.method", self.method, RECONSTRUCTION_METHODS)
        require_range("reconstruction.iters", self.iters, 1, MAX_RECONSTRUCTION_ITERS, integer=True)
        require_range("reconstruction.batch_size", self.batch_size, 1, 4096, integer=True)
        require_range("reconstruction.num_samples", self.num_samples, 1, 1_000_000, integer=True)
        if self.weight_lr is not None:
            require_range("reconstruction.weight_lr", self.weight_lr, 1e-8, 1.0)
        require_range("reconstruction.activation_lr", self.activation_lr, 0.0, 1.0)
        require_range("reconstruction.rounding_loss_weight", self.rounding_loss_weight, 0.0, 100.0)
        require_range("reconstruction.warmup", self.warmup, 0.0, 1.0)
        require_range("reconstruction.beta_start", self.beta_start, 1.0, 100.0)
        require_range("reconstruction.beta_end", self.beta_end, 1.0, 100.0)
        if self.beta_end > self.beta_start:
            raise ValueError(
                f"reconstruction.beta_end ({self.beta_end}) must not exceed beta_start ({self.beta_start})"
            )
        require_range("reconstruction.drop_prob", self.drop_prob, 0.0, 1.0)
        require_range("reconstruction.cache_bytes", self.cache_bytes, 0, 2**40, integer=True)
        require_range("reconstruction.seed", self.seed, 0, 2**63 - 1, integer=True)
        require_range("reconstruction.threads", self.threads, 0, 1024, integer=True)

    @property
    def rounding_lr(self) -> float:
        """Adam step on V: ``weight_lr``, or by default 10/iters within [1e-3, 0.05]. V must travel to
        about ±2.4 for h(V) to saturate at 0 or 1; the papers' 1e-3 gets there in their 20000 steps,
        a CPU budget of a few hundred steps needs a larger step (measured: 300 steps at 1e-3 leave 90 %
        of h(V) undecided and hardening then loses what the soft rounding gained)."""
        if self.weight_lr is not None:
            return self.weight_lr
        return min(0.05, max(1e-3, 10.0 / self.iters))

    @property
    def blockwise(self) -> bool:
        """BRECQ and QDrop reconstruct blocks; AdaRound single layers."""
        return self.method != "adaround"

    @property
    def learns_activation_scales(self) -> bool:
        return self.method != "adaround"

    @property
    def effective_drop_prob(self) -> float:
        """p of QDrop; 0 for the other methods."""
        return self.drop_prob if self.method == "qdrop" else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}
