"""Options of the QAT stage: the whole quantized graph trained by distillation from its FP32 self
(``quantcore.qat``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantcore.checks import require_bool, require_choice, require_range
from quantcore.config.choices import QAT_LOSSES

MAX_QAT_EPOCHS = 1000
MAX_QAT_STEPS = 100_000  # optimizer steps per epoch


@dataclass(frozen=True)
class QatConfig:
    """Quantization-aware training after calibration (and reconstruction), before export (stage ``qat``).

    The first ``num_samples`` calibration samples are split: the last ``holdout`` fraction is held out
    for the metric measured after every epoch (SQNR of the outputs against FP32's), the rest trains.
    epochs: passes; steps: optimizer steps per epoch (None: one pass over the training split, in batches
    of ``batch_size`` drawn without replacement). lr: Adam step on the weights and biases; scale_lr:
    Adam step on log s of each learned scale (``learn_scales``: the activation scales and the weight
    scales, LSQ), a relative step, hence its own rate. loss: ``mse`` (every float output's squared error
    divided by the FP32 output's mean square) or ``kl`` (the same, except class scores and probabilities:
    KL divergence of the quantized model's distribution from FP32's, ``quantcore.qat.distillation``).
    seed: the sampling order. threads: torch intra-op threads on CPU (0: torch's default).
    checkpoint_every: optimizer steps between two resume checkpoints, where the run keeps them
    (``quantcore.qat.checkpoint``).
    """

    epochs: int = 10
    steps: int | None = None
    lr: float = 1e-4
    scale_lr: float = 1e-3
    batch_size: int = 32
    num_samples: int = 1024
    holdout: float = 0.2
    loss: str = "mse"
    learn_scales: bool = True
    seed: int = 0
    threads: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        require_range("qat.epochs", self.epochs, 1, MAX_QAT_EPOCHS, integer=True)
        if self.steps is not None:
            require_range("qat.steps", self.steps, 1, MAX_QAT_STEPS, integer=True)
        # (0, 1]: lr 0 would train nothing and report it as trained
        require_range("qat.lr", self.lr, 1e-9, 1.0)
        require_range("qat.scale_lr", self.scale_lr, 0.0, 1.0)
        require_range("qat.batch_size", self.batch_size, 1, 4096, integer=True)
        require_range("qat.num_samples", self.num_samples, 2, 1_000_000, integer=True)
        require_range("qat.holdout", self.holdout, 0.05, 0.5)
        require_choice("qat.loss", self.loss, QAT_LOSSES)
        require_bool("qat.learn_scales", self.learn_scales)
        require_range("qat.seed", self.seed, 0, 2**63 - 1, integer=True)
        require_range("qat.threads", self.threads, 0, 1024, integer=True)
        require_range("qat.checkpoint_every", self.checkpoint_every, 1, MAX_QAT_STEPS, integer=True)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}
