"""Options of the QAT stage: the whole quantized graph trained by distillation from its FP32 self
(``quantcore.qat``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from quantcore.checks import require_bool, require_choice, require_range
from quantcore.config.choices import QAT_LOSSES

MAX_QAT_EPOCHS = 1000
MAX_QAT_STEPS = 100_000  # optimizer steps per epoch
MAX_LABEL_WEIGHT = 100.0
MAX_CROP_PADDING = 64  # pixels on each side
MAX_INTERMEDIATE = 64  # intermediate tensors distilled


@dataclass(frozen=True)
class QatAugment:
    """Random changes to each training sample of an image model (every batched input NCHW float, C ≤ 4),
    drawn per sample and applied alike to all its inputs (``quantcore.qat.augmentation``):
    flip: mirror along W with probability 1/2; crop_padding p: zero-pad H and W by p on each side, then
    crop back to H x W at a uniformly drawn offset (shifts of up to ±p pixels). The FP32 targets follow
    the augmented sample; a label does not, so with a label loss flip only where a mirrored sample keeps
    its class (not for digits or text)."""

    flip: bool = False
    crop_padding: int = 0

    def __post_init__(self) -> None:
        require_bool("qat.augment.flip", self.flip)
        require_range("qat.augment.crop_padding", self.crop_padding, 0, MAX_CROP_PADDING, integer=True)

    @property
    def active(self) -> bool:
        return self.flip or self.crop_padding > 0


@dataclass(frozen=True)
class QatConfig:
    """Quantization-aware training after calibration (and reconstruction), before export (stage ``qat``).

    The first ``num_samples`` calibration samples are split: the last ``holdout`` fraction is held out
    for the metric measured after every epoch (SQNR of the outputs against FP32's), the rest trains.
    epochs: passes; steps: optimizer steps per epoch (None: one pass over the training split, in batches
    of ``batch_size`` drawn without replacement). Both rates are relative, so that one default serves
    models whose weights differ in size by orders of magnitude and grids of any bit width
    (``quantcore.qat.graph_module``): lr is Adam's step on the weights and biases as a fraction of each
    tensor's root mean square per quantization channel (a weight of RMS 1e-4 moves by about lr·1e-4 a
    step); scale_lr is Adam's step on log s of each learned scale (``learn_scales``: the activation and
    weight scales, LSQ) in quantization steps of the grid's range (L = quant_max - quant_min steps: log s
    moves by scale_lr / L). The defaults, lr 3e-4 and scale_lr 2e-2, were chosen on the narrow ResNet at
    W4A4 and on ocr-det at INT8 together, then checked on the digits CNN and the other real models of
    ``bench.qat --real`` (``bench/README.md``).
    loss: ``mse`` (every float output's squared error divided by the FP32 output's mean square) or ``kl``
    (the same, except class scores and probabilities: KL divergence of the quantized model's distribution
    from FP32's, ``quantcore.qat.distillation``).
    label_weight w: with labels for the calibration samples, w times the cross-entropy of the first class
    output (scores or probabilities) against them is added to the loss (0: distillation alone).
    augment: random flips and shifted crops of image training samples (``QatAugment``; None: none); the
    FP32 targets are then computed on each augmented batch. intermediate: tensors of the graph distilled
    as well, each by its squared error relative to its FP32 mean square (as mse).
    seed: the sampling order and the augmentation. threads: torch intra-op threads on CPU (0: torch's default).
    checkpoint_every: optimizer steps between two resume checkpoints, where the run keeps them
    (``quantcore.qat.checkpoint``).
    """

    epochs: int = 10
    steps: int | None = None
    lr: float = 3e-4
    scale_lr: float = 2e-2
    batch_size: int = 32
    num_samples: int = 1024
    holdout: float = 0.2
    loss: str = "mse"
    learn_scales: bool = True
    label_weight: float = 0.0
    augment: QatAugment | None = None
    intermediate: tuple[str, ...] = ()
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
        require_range("qat.label_weight", self.label_weight, 0.0, MAX_LABEL_WEIGHT)
        if self.augment is not None and not isinstance(self.augment, QatAugment):
            raise ValueError(f"qat.augment must be a QatAugment or None, got {self.augment!r}")
        if not isinstance(self.intermediate, tuple) or not all(isinstance(n, str) and n for n in self.intermediate):
            raise ValueError(f"qat.intermediate must be a tuple of tensor names, got {self.intermediate!r}")
        if len(self.intermediate) > MAX_INTERMEDIATE:
            raise ValueError(f"qat.intermediate: at most {MAX_INTERMEDIATE} tensors, got {len(self.intermediate)}")
        require_range("qat.seed", self.seed, 0, 2**63 - 1, integer=True)
        require_range("qat.threads", self.threads, 0, 1024, integer=True)
        require_range("qat.checkpoint_every", self.checkpoint_every, 1, MAX_QAT_STEPS, integer=True)

    def to_dict(self) -> dict[str, Any]:
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        augment = None if self.augment is None else asdict(self.augment)
        return {**values, "augment": augment, "intermediate": list(self.intermediate)}
