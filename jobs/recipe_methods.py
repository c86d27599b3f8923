"""The recipe's sections for the methods that change a calibrated model before export (reconstruction,
mixed precision, QAT) or replace calibration (weight-only), and ``Spec``, every section's base: unknown
fields refused (a typo never silently does nothing), values frozen. ``jobs.recipe`` checks how they combine
with the rest of the recipe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MixedPrecisionSpec(Spec):
    max_fraction: float = Field(
        0.05,
        gt=0.0,
        le=0.5,
        description="At most this fraction of the quantizable layers (at least one) leaves the recipe's precision.",
    )
    metric: Literal["cosine", "sqnr"] = Field(
        "cosine",
        description="What stops the promotion: the worst float output's cosine / SQNR (dB) to FP32 on calibration "
        "samples (top-1 needs labels, which calibration samples lack).",
    )
    threshold: float = Field(0.99, ge=-100.0, le=300.0, description="Promotion stops once the metric reaches this.")

    @field_validator("threshold")
    @classmethod
    def _threshold_fits_metric(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("metric") == "cosine" and not -1.0 <= value <= 1.0:
            raise ValueError("a cosine threshold must be in [-1, 1]")
        return value


class ReconstructionSpec(Spec):
    method: Literal["none", "adaround", "brecq", "qdrop"] = Field(
        "none",
        description="none: round to nearest; adaround: learned rounding layer by layer; brecq: block by block "
        "with learned activation scales; qdrop: brecq with activation quantization randomly dropped while learning.",
    )
    iters: int = Field(2000, ge=1, le=100_000, description="Optimizer steps per block (the papers use 20000 on GPU).")
    batch_size: int = Field(32, ge=1, le=1024, description="Samples per reconstruction step.")
    num_samples: int = Field(
        1024, ge=1, le=100_000, description="Calibration samples whose block inputs and outputs are cached."
    )
    rounding_loss_weight: float = Field(
        3.0,
        ge=0.0,
        le=100.0,
        description="Weight λ of the rounding regularizer (3, not the papers' 0.01: see ReconstructionConfig).",
    )
    warmup: float = Field(0.2, ge=0.0, le=1.0, description="Fraction of the steps without the rounding regularizer.")
    drop_prob: float = Field(
        0.5, ge=0.0, le=1.0, description="qdrop: probability of dropping an activation's quantization."
    )
    cache_mb: int = Field(
        1024, ge=0, le=262_144, description="Block inputs/targets stay in memory up to this size, on disk beyond."
    )


MAX_IMAGE_CHANNELS = 4  # QAT augments NCHW images: gray, RGB, RGBA (quantcore.qat.augmentation)


class QatAugmentSpec(Spec):
    flip: bool = Field(
        False,
        description="Mirror each training image left-right with probability 1/2 (with label_weight: only where a "
        "mirrored image keeps its class).",
    )
    crop_padding: int = Field(
        0,
        ge=0,
        le=64,
        description="Zero-pad each training image by this many pixels on every side, then crop it back to its "
        "size at a random offset: shifts of up to this many pixels (0: none).",
    )


class QatSpec(Spec):
    epochs: int = Field(10, ge=1, le=1000, description="Passes of training, each followed by the held-out metric.")
    steps: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Optimizer steps per epoch (null: one pass over the training part of the calibration samples).",
    )
    lr: float = Field(
        3e-4,
        gt=0,
        le=1.0,
        description="Adam step on the weights and biases, as a fraction of each tensor's RMS per channel.",
    )
    scale_lr: float = Field(
        2e-2,
        ge=0,
        le=1.0,
        description="Adam step on each learned scale, in quantization steps of its grid's range per step.",
    )
    batch_size: int = Field(32, ge=1, le=1024, description="Samples per training step.")
    num_samples: int = Field(
        1024, ge=2, le=100_000, description="Calibration samples used: the training part and the held-out part."
    )
    holdout: float = Field(
        0.2, ge=0.05, le=0.5, description="Fraction of those samples held out for the metric measured every epoch."
    )
    loss: Literal["mse", "kl"] = Field(
        "mse",
        description="mse: each output's squared error relative to its FP32 power; kl: the same, but the KL "
        "divergence from FP32's distribution for class-score (batch, classes) and Softmax outputs.",
    )
    learn_scales: bool = Field(True, description="Also learn the activation and weight scales (LSQ).")
    label_weight: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="Weight of a cross-entropy term on the dataset's labels, added to the distillation loss and "
        "read from the first class output (0: distillation alone). Needs a dataset with labels.",
    )
    augment: QatAugmentSpec | None = Field(
        None,
        description="Random flips and shifted crops of the training samples, for image models (every input NCHW "
        "float with at most 4 channels); the FP32 targets are computed again on each augmented batch.",
    )
    intermediate: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Tensors inside the model (names as in Netron) distilled as well: each one's squared error "
        "relative to its FP32 mean square is added to the loss.",
    )
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Seeds the batch order (null: the recipe's seed).")
    checkpoint_every: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Optimizer steps between two checkpoints: a job whose worker stops resumes training from the last.",
    )


def qat_batch_shortfall(qat: QatSpec, calibration_samples: int) -> str | None:
    """Why ``calibration_samples`` cannot fill one QAT training batch once the held-out part is set aside
    (None: they can): the rule quantcore.qat applies, checked before the job is queued."""
    available = min(qat.num_samples, calibration_samples)
    train = available - max(1, round(available * qat.holdout))
    if qat.batch_size <= train:
        return None
    return (
        f"qat.batch_size {qat.batch_size} exceeds the {train} training samples left of {available} "
        f"calibration samples after holding out {qat.holdout:g}: lower batch_size or give more samples"
    )


def qat_data_problems(
    qat: QatSpec, *, has_labels: bool, samples: Mapping[str, tuple[str, list[int | str | None]]]
) -> list[tuple[str, str]]:
    """(field, reason) pairs why the data cannot serve ``qat``'s label loss or augmentation (empty: it can),
    the rules quantcore.qat applies, checked before the job is queued. ``samples``: model input → (dtype,
    the shape of one sample)."""
    problems = []
    if qat.label_weight > 0 and not has_labels:
        problems.append(("recipe.qat.label_weight", "a label loss needs a dataset with labels; this one has none"))
    if qat.augment is not None and (qat.augment.flip or qat.augment.crop_padding > 0):
        for name, (dtype, shape) in samples.items():
            channels = shape[0] if len(shape) == 3 else None
            if not dtype.startswith("float") or not isinstance(channels, int) or channels > MAX_IMAGE_CHANNELS:
                problems.append(
                    (
                        "recipe.qat.augment",
                        f"input '{name}' takes {dtype} {shape} per sample; augmentation flips and crops images "
                        f"only: NCHW floats with at most {MAX_IMAGE_CHANNELS} channels",
                    )
                )
    return problems


class WeightOnlySpec(Spec):
    algorithm: Literal["rtn", "gptq", "awq", "hqq"] = Field(
        "rtn",
        description="rtn: round to nearest; gptq: column by column with the rounding error compensated through the "
        "calibration data's second moments (Frantar et al. 2022); awq: weight rows scaled by their input channel's "
        "mean magnitude to a searched power before rounding, the input divided back (Lin et al. 2023); hqq: "
        "data-free, each block's scale and zero point fitted to the weights (Badri & Shaji 2023).",
    )
    block_size: int = Field(
        32, ge=16, le=256, description="Weights per scale along the reduction axis: a power of two in 16..256."
    )
    symmetric: bool = Field(True, description="A fixed zero point (true) or one per block (false).")
    format: Literal["matmulnbits", "dequantize_linear"] = Field(
        "matmulnbits",
        description="matmulnbits: com.microsoft.MatMulNBits (ONNX Runtime's n-bit kernel); dequantize_linear: "
        "opset-21 blocked DequantizeLinear before each MatMul (portable ONNX).",
    )
    act_order: bool = Field(False, description="gptq: visit the weight rows by decreasing input energy.")
    quantize_lm_head: bool = Field(
        False, description="Also quantize the LM head (the last MatMul writing a graph output), kept float by default."
    )
    quantize_embeddings: bool = Field(
        False,
        description="Also quantize the embedding tables (Gather of a 2-D float table), round to nearest in blocks "
        "along each row, kept float by default; matmulnbits writes com.microsoft.GatherBlockQuantized.",
    )
    accuracy_level: int = Field(
        4,
        ge=0,
        le=4,
        description="matmulnbits: what ONNX Runtime's CPU kernel computes the activation in: 4 int8 per block (its "
        "integer path, faster than the float path on CPUs), 0 unset and 1 float32, 2 float16, 3 bfloat16.",
    )

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"block_size must be a power of two, not {value}")
        return value
