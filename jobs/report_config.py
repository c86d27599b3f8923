"""The run's configuration as report.json records it (``quantcore.config.QuantizeConfig.to_dict``), and
``Section``, the base of every report section (``jobs.report_schema``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """A report section: fields it does not list are kept (a report written by a newer engine is served)."""

    model_config = ConfigDict(extra="allow")


# ---- config (quantcore.config.QuantizeConfig.to_dict) ----


class WeightOnlyConfig(Section):
    algorithm: Literal["rtn", "gptq", "awq", "hqq"]
    block_size: int = Field(description="Weights per scale along the reduction axis K (the last block may be short).")
    symmetric: bool = Field(description="true: zero point 2^(bits-1) for every block; false: one per block.")
    format: Literal["matmulnbits", "dequantize_linear"]
    act_order: bool = Field(description="gptq: rows visited by decreasing H diagonal (block scales computed first).")
    damping: float = Field(description="gptq: λ = damping · mean(diag H) added to H's diagonal.")
    quantize_lm_head: bool = Field(description="Whether the LM head was quantized too (kept float by default).")
    quantize_embeddings: bool = Field(
        False, description="Whether the embedding tables were quantized too (kept float by default)."
    )
    accuracy_level: int = Field(description="matmulnbits: MatMulNBits' accuracy_level (4: int8 activations per block).")


class OverrideConfig(Section):
    pattern: str
    bits: int | None
    observer: str | None


class AnalysisConfig(Section):
    enabled: bool
    graphwise_samples: int | None
    layerwise_samples: int
    max_layers: int
    layerwise_seconds: float | None = None


class TargetConfig(Section):
    metric: Literal["top1_drop", "cosine", "sqnr"]
    threshold: float
    max_float_layers: int | None


class AutoConfig(Section):
    budget_seconds: float
    objective: TargetConfig
    candidates: list[str] | None = Field(description="The candidates asked for; null: all that apply.")


class ReconstructionConfig(Section):
    method: Literal["adaround", "brecq", "qdrop"]
    iters: int = Field(description="Optimizer steps per block.")
    batch_size: int
    num_samples: int = Field(description="Calibration samples whose block inputs and outputs were cached.")
    weight_lr: float | None
    activation_lr: float
    rounding_loss_weight: float = Field(description="λ of the rounding regularizer Σ(1 - |2h(V) - 1|^β).")
    warmup: float = Field(description="Fraction of the steps without the rounding regularizer.")
    beta_start: float
    beta_end: float
    drop_prob: float = Field(description="qdrop: probability of dropping an activation's quantization.")
    cache_bytes: int
    seed: int
    threads: int


class QatAugment(Section):
    flip: bool
    crop_padding: int = Field(description="Pixels of zero padding on each side before the random crop; 0: no crop.")


class QatConfig(Section):
    epochs: int
    steps: int | None = Field(description="Optimizer steps per epoch; null: one pass over the training samples.")
    lr: float = Field(description="Adam step on the weights and biases, a fraction of each tensor's RMS per channel.")
    scale_lr: float = Field(
        description="Adam step on each learned scale, in quantization steps of its grid's range per step."
    )
    batch_size: int
    num_samples: int = Field(description="Calibration samples used, training and held-out parts together.")
    holdout: float = Field(description="Fraction of them held out for the metric measured every epoch.")
    loss: Literal["mse", "kl"]
    learn_scales: bool
    label_weight: float = Field(0.0, description="Weight of the cross-entropy on labels in the loss; 0: none.")
    augment: QatAugment | None = Field(None, description="Random flips and crops of the training images; null: none.")
    intermediate: list[str] = Field(default_factory=list, description="Tensors inside the model distilled as well.")
    seed: int
    threads: int
    checkpoint_every: int = Field(description="Optimizer steps between two resume checkpoints.")


class MixedPrecisionObjective(Section):
    metric: Literal["cosine", "sqnr"]
    threshold: float


class MixedPrecisionConfig(Section):
    max_fraction: float = Field(description="At most this fraction of the quantizable layers (at least one).")
    objective: MixedPrecisionObjective


class RunConfig(Section):
    platform: str
    precision: str
    observer: str
    percentile: float = Field(description="The percentile the run used: the one the search kept, if it ran.")
    percentile_candidates: list[float] = Field(default_factory=list)
    clip: Literal["percentile", "mse"] = Field(
        "percentile",
        description="Where tensors observed by percentile were clipped: at the percentile, or at the threshold "
        "minimising their quantization error estimated on the same histogram (kept by the search).",
    )
    batch_size: int
    exclude_op_types: list[str]
    exclude_node_patterns: list[str] = Field(
        description="Includes the layers the accuracy-target mode and mixed precision (where it keeps layers float) "
        "kept in float."
    )
    overrides: list[OverrideConfig]
    reduce_range: str
    device: str = Field(
        description="cpu, cuda, or auto (a worker's: torch trains on its GPU where there is one; ONNX Runtime "
        "sessions on the CPU EP)."
    )
    disabled_optimizers: list[str] = Field(
        default_factory=list, description="ONNX Runtime graph rewrites the deployed session skips (see parity)."
    )
    cpu_latency: bool = Field(title="CPU latency")
    tensorrt_engine: bool = Field(title="TensorRT engine")
    analysis: AnalysisConfig | None = None
    target: TargetConfig | None = None
    reconstruction: ReconstructionConfig | None = None
    qat: QatConfig | None = None
    equalization: bool = Field(
        False, description="Whether cross-layer equalization rescaled the prepared model's layer pairs."
    )
    bias_correction: bool = Field(
        False, description="Whether the quantized layers' biases were corrected for their weights' mean shift."
    )
    mixed_precision: MixedPrecisionConfig | None = Field(
        None, description="The mixed-precision search's settings (the report's mixed_precision section: its outcome)."
    )
    wide_tensors: list[str] = Field(
        default_factory=list,
        description="Tensors quantized at 16 bits (int16/uint16) instead of the precision's width: mixed "
        "precision's promotions on the platforms that run them.",
    )
    smoothquant: bool = Field(
        False,
        description="Whether SmoothQuant was asked for: MatMul/Gemm and Conv inputs' outlier channels moved into "
        "their weights (the prepare stage's message gives the layers smoothed and the alpha kept).",
    )
    strategy: Literal["fixed", "auto"] = Field(
        "fixed",
        description="fixed for the files written, also after an auto search: this config, run again, gives them "
        "(the search itself is the report's auto section).",
    )
    auto: AutoConfig | None = Field(None, description="The auto search's settings (read with strategy auto only).")
    cpu_objective: Literal["accuracy", "latency", "size"] = Field(
        "accuracy",
        title="CPU objective",
        description="latency: the place stage kept in float the regions that ran slower quantized (see placement).",
    )
    cpu_threads: int | None = Field(None, title="CPU threads", description="null: every core of the worker.")
    cpu_batch_sizes: list[int] = Field(default_factory=lambda: [1, 32], title="CPU batch sizes")
    cpu_timing_share: float = Field(
        1.0,
        title="CPU timing share",
        description="The placement's timing runs, as a multiple of the calibration's time.",
    )
    weight_only: WeightOnlyConfig | None = Field(None, description="Platform onnxruntime-weight-only only.")
