"""The user-facing recipe: what a job should do, validated before anything is queued.

Unknown fields are refused (`extra="forbid"`) so a typo never silently does nothing; every bound
is stated on the field, so a validation error names the field and the allowed range. Choices that
depend on each other are checked on the later field, so the error names it too:

    platform        tensorrt | tensorrt-fp8 | onnxruntime | onnxruntime-dynamic | onnxruntime-weight-only | academic
    precision       tensorrt, onnxruntime(-dynamic): int8 (= w8a8);  tensorrt-fp8: fp8 only;
                    academic: int8 or wXaY (weights X bits, activations Y bits, X, Y in 2..8);
                    onnxruntime-weight-only: w4 or w8 (weights only, activations float)
    weight_only     only with platform onnxruntime-weight-only (its defaults there when left out);
                    block_size a power of two in 16..256
    overrides.bits  not with fp8 (FP8 has one width)
    deploy.cpu_objective  latency only with platform onnxruntime (its default there; accuracy elsewhere)
    reduce_range    on/off only with the onnxruntime platforms (7-bit weights, or full int8 ones stored
                    as uint8, for CPUs without VNNI)
    target.threshold  in [-1, 1] with metric cosine
    strategy        fixed | auto (auto: not with a target; its objective is a target of its own)
    auto.candidates names from AUTO_CANDIDATES
    qat             not with a target, nor on onnxruntime-weight-only; batch_size at most the training part
                    (1 - holdout) of min(qat.num_samples, calibration.num_samples)
    mixed_precision not with a target, a reconstruction or bias_correction, nor on onnxruntime-weight-only;
                    threshold in [-1, 1] with metric cosine

The worker translates a `Recipe` into quantcore's own dataclasses in exactly one function
(`worker.translate.to_quantize_config`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from jobs.preprocessing import PreprocessingSpec
from jobs.recipe_deploy import DeploySpec
from jobs.recipe_methods import (
    MixedPrecisionSpec,
    QatSpec,
    ReconstructionSpec,
    WeightOnlySpec,
    qat_batch_shortfall,
)
from jobs.recipe_methods import Spec as _Spec

Platform = Literal[
    "tensorrt", "tensorrt-fp8", "onnxruntime", "onnxruntime-dynamic", "onnxruntime-weight-only", "academic"
]
WEIGHT_ONLY_PLATFORM = "onnxruntime-weight-only"
ONNXRUNTIME_PLATFORMS = ("onnxruntime", "onnxruntime-dynamic")  # int8 weights on u8s8 kernels: reduce_range
Observer = Literal["minmax", "ema_minmax", "percentile", "kl", "mse", "floating"]
PRECISION_PATTERN = r"^(int8|fp8|w[2-8]a[2-8]|w4|w8)$"
# platform → precisions it accepts (None: int8 and any wXaY)
PLATFORM_PRECISIONS: dict[str, tuple[str, ...] | None] = {
    "tensorrt": ("int8", "w8a8"),
    "tensorrt-fp8": ("fp8",),
    "onnxruntime": ("int8", "w8a8"),
    "onnxruntime-dynamic": ("int8", "w8a8"),
    "onnxruntime-weight-only": ("w4", "w8"),
    "academic": None,
}


# Entries in each of a recipe's lists (overrides, exclude.op_types, exclude.node_patterns). Far more
# than a recipe needs: one shell-style pattern covers many nodes.
MAX_LIST_ENTRIES = 256


def _capped(entries: str, hint: str) -> BeforeValidator:
    """Refuse a list longer than MAX_LIST_ENTRIES by its length, before any entry is validated: a
    body under the JSON cap still holds some 40,000 overrides, and the message says what to do."""

    def check(value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_LIST_ENTRIES:
            raise ValueError(f"at most {MAX_LIST_ENTRIES} {entries}, not {len(value)}: {hint}")
        return value

    return BeforeValidator(check)


_PATTERN_HINT = "one shell-style pattern such as '/encoder/*' covers many nodes"


class CalibrationSpec(_Spec):
    observer: Observer = Field(
        "percentile",
        description="How activation ranges are derived from the calibration data: minmax, ema_minmax "
        "(moving average of batch ranges), percentile (of |x|), kl (TensorRT entropy; it can clip heavy-tailed "
        "activations far too hard), mse (error "
        "minimizing), floating (FP8 scale search).",
    )
    percentile: float = Field(
        99.99, ge=90.0, le=100.0, description="With observer=percentile: the |x| percentile taken as range."
    )
    percentile_candidates: list[Annotated[float, Field(ge=90.0, le=100.0)]] = Field(
        [99.9, 99.99, 99.999, 100.0],
        max_length=8,
        description="With observer=percentile: other percentiles to try, with each tensor's MSE threshold read from "
        "the same histograms; the one whose quantized model reproduces the FP32 outputs best on the calibration "
        "data is kept, given 64 samples or more (the report's config names it). [] tries none.",
    )
    num_samples: int = Field(
        512, ge=1, le=100_000, description="At most this many dataset samples are used for calibration."
    )
    batch_size: int = Field(16, ge=1, le=1024, description="Samples per calibration batch.")


class EvaluationSpec(_Spec):
    holdout_fraction: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="Fraction of the dataset held out from calibration and used to compare FP32 with the "
        "quantized model. Calibration and evaluation never share a sample.",
    )
    max_samples: int = Field(1000, ge=1, le=100_000, description="At most this many held-out samples are evaluated.")


class ExcludeSpec(_Spec):
    op_types: Annotated[list[str], _capped("op types", "ONNX has fewer op types than that")] = Field(
        default_factory=list, max_length=MAX_LIST_ENTRIES, description="ONNX op types to keep in float, e.g. ['Gemm']."
    )
    node_patterns: Annotated[list[str], _capped("node patterns", _PATTERN_HINT)] = Field(
        default_factory=list,
        max_length=MAX_LIST_ENTRIES,
        description="Shell-style patterns over node names to keep in float, e.g. ['/head/*'].",
    )

    @field_validator("op_types", "node_patterns")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item or len(item) > 256:
                raise ValueError("entries must be non-empty strings of at most 256 characters")
        return value


class NodeOverrideSpec(_Spec):
    pattern: str = Field(
        ..., min_length=1, max_length=256, description="Shell-style pattern over node names, e.g. '/stem/*'."
    )
    bits: int | None = Field(None, ge=2, le=8, description="Bits for the matching nodes' weights and activations.")
    observer: Observer | None = Field(None, description="Observer for the matching nodes' activations.")

    @model_validator(mode="after")
    def _something_to_override(self) -> NodeOverrideSpec:
        if self.bits is None and self.observer is None:
            raise ValueError("an override sets bits and/or observer")
        return self


class AnalysisSpec(_Spec):
    enabled: bool = Field(
        True,
        description="Measure each quantized tensor's SQNR in the quantized model and each layer's error when "
        "it alone is quantized, ranked by harm. Always on with a target.",
    )
    graphwise_samples: int | None = Field(
        None, ge=1, le=100_000, description="Evaluation samples for the per-tensor statistics (null: all)."
    )
    layerwise_samples: int = Field(
        64,
        ge=1,
        le=10_000,
        description="Evaluation samples for the one-layer-at-a-time runs (cost: layers x samples forward passes).",
    )
    max_layers: int = Field(
        256,
        ge=1,
        le=100_000,
        description="At most this many layers get a layer-wise run: those whose own quantization loses most.",
    )
    layerwise_seconds: float | None = Field(
        120.0,
        gt=0,
        le=86_400,
        description="Hold the one-layer-at-a-time runs to about this many seconds (fewer samples, then fewer "
        "layers; null: no limit).",
    )


class TargetSpec(_Spec):
    metric: Literal["top1_drop", "cosine", "sqnr"] = Field(
        ...,
        description="top1_drop: FP32 minus quantized top-1 in percentage points (needs labels), met when <= "
        "threshold; cosine / sqnr: the worst output's cosine / SQNR (dB) to FP32, met when >= threshold.",
    )
    threshold: float = Field(..., ge=-100.0, le=300.0, description="The bound the metric must meet.")
    max_float_layers: int | None = Field(
        None, ge=1, le=100_000, description="At most this many layers may be kept in float (null: as many as needed)."
    )

    @field_validator("threshold")
    @classmethod
    def _threshold_fits_metric(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("metric") == "cosine" and not -1.0 <= value <= 1.0:
            raise ValueError("a cosine threshold must be in [-1, 1]")
        return value


# The candidates strategy auto may try, cheapest first (quantcore.config.AUTO_CANDIDATES; a test pins the two).
AutoCandidate = Literal[
    "as_given",
    "full_weights",
    "minmax",
    "mse",
    "kl",
    "floating",
    "equalization",
    "bias_correction",
    "smoothquant",
    "mixed_precision",
    "adaround",
]


class ObjectiveSpec(TargetSpec):
    metric: Literal["top1_drop", "cosine", "sqnr"] = Field(
        "cosine",
        description="top1_drop: FP32 minus quantized top-1 in percentage points (needs labels; scored against the "
        "FP32 model's own predictions while searching), met when <= threshold; cosine / sqnr: the worst float "
        "output's cosine / SQNR (dB) to FP32, met when >= threshold.",
    )
    threshold: float = Field(0.99, ge=-100.0, le=300.0, description="The bound the metric must meet.")
    max_float_layers: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="When no candidate meets the objective: at most this many layers may be kept in float.",
    )


class AutoSpec(_Spec):
    budget_seconds: float = Field(
        900.0,
        ge=10.0,
        le=86_400.0,
        description="Seconds the search and the final run with the chosen settings may take together: each "
        "candidate's final run is estimated from its own stages and held back. The first candidate (the recipe as "
        "given) is stopped too when it and its final run cannot both fit; the final run is then the recipe as "
        "given, unscored and without the layer-wise analysis, and the report says so.",
    )
    objective: ObjectiveSpec = Field(
        default_factory=ObjectiveSpec,
        description="What a candidate must reach on the selection split (the last 25 % of the calibration "
        "samples, which the candidates do not calibrate on). The most accurate is kept; with deploy.cpu_objective "
        "latency, one that meets the objective too and is clearly faster on the worker's CPU is kept instead. "
        "When none meets it, the best keeps its most harmful layers in float until it does.",
    )
    candidates: list[AutoCandidate] | None = Field(
        None,
        min_length=1,
        description="Candidates to try, cheapest first whatever the order given (null: all that apply to the "
        "platform): as_given, full_weights (onnxruntime platforms, on a worker CPU without VNNI), the activation "
        "observers minmax, mse, kl (floating on tensorrt-fp8), equalization, bias_correction, smoothquant, "
        "mixed_precision, adaround.",
    )


class Recipe(_Spec):
    platform: Platform = Field(
        "tensorrt",
        description="Target runtime whose quantization rules the model follows: tensorrt (INT8), "
        "tensorrt-fp8 (FP8 E4M3), onnxruntime (QDQ for the CPU EP's integer kernels), onnxruntime-dynamic "
        "(only MatMuls with constant weights, their inputs quantized at run time from each batch's range: "
        "transformers on the CPU EP), onnxruntime-weight-only (MatMul/Gemm weights at 4 or 8 bits in blocks, "
        "activations float: transformers), academic (2-8 bit).",
    )
    precision: str = Field(
        "int8",
        pattern=PRECISION_PATTERN,
        validate_default=True,  # the default int8 must still fit the chosen platform
        description="Numeric format: int8, fp8, wXaY (weights X bits, activations Y bits, 2-8), or w4 / w8 "
        "(weight-only). Left out: the platform's first (fp8 on tensorrt-fp8, w4 on onnxruntime-weight-only), int8 "
        "elsewhere.",
    )
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    exclude: ExcludeSpec = Field(default_factory=ExcludeSpec)
    overrides: Annotated[list[NodeOverrideSpec], _capped("overrides", _PATTERN_HINT)] = Field(
        default_factory=list,
        max_length=MAX_LIST_ENTRIES,
        description="Per-node bits/observer; the first matching pattern wins.",
    )
    reduce_range: Literal["auto", "on", "off"] = Field(
        "auto",
        description="onnxruntime platforms only: on = 7-bit weights [-64, 63], which u8s8 kernels on x86 CPUs "
        "without VNNI do not saturate; off = full int8 weights, stored as uint8 on such a CPU (exact u8u8 kernels, "
        "slower); auto = on for a worker CPU without VNNI, off otherwise.",
    )
    deploy: DeploySpec = Field(default_factory=DeploySpec, validate_default=True)  # cpu_objective's default: platform's
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    target: TargetSpec | None = Field(
        None,
        description="An accuracy the job must reach: the most harmful layers (by the layer-wise analysis) are "
        "kept in float step by step until it is met; if it cannot be, the job fails with the best model kept.",
    )
    reconstruction: ReconstructionSpec | None = Field(
        None, description="Learned rounding after calibration (AdaRound, BRECQ, QDrop); null or method none for none."
    )
    qat: QatSpec | None = Field(
        None,
        description="Quantization-aware training after calibration (and reconstruction), before export: the "
        "whole quantized model trained to reproduce the FP32 model's outputs on the calibration samples, kept "
        "only if it beats post-training quantization on the held-out part; a model with an op the trainer "
        "cannot run stays post-training quantized, with the reason in the report.",
    )
    equalization: bool = Field(
        False,
        description="Cross-layer equalization before quantizing: each Conv→Conv or Gemm→Gemm pair (through a "
        "Relu, LeakyRelu or PRelu) rescaled per channel so both layers' weight ranges match; the FP32 model "
        "computes the same function, and per-tensor activations between the layers lose less.",
    )
    bias_correction: bool = Field(
        False,
        description="After calibration, each quantized Conv/Gemm with a bias has the mean output shift caused by "
        "quantizing its weights (measured on the calibration data) subtracted from its bias. Not with a target.",
    )
    smoothquant: bool = Field(
        False,
        description="SmoothQuant before quantizing: where a MatMul/Gemm or Conv input has outlier channels (as "
        "transformer activations and some CNN feature maps do), each channel is divided by a factor the weights "
        "reading it are multiplied by, so the per-tensor activation scale is not spent on a few channels; the FP32 "
        "model computes the same function. The migration strength alpha is chosen on the calibration data, each "
        "alpha scored on samples held out from its calibration (half of them, 32 at most) and kept only where it "
        "beats the unsmoothed model beyond those samples' noise; the report's prepare.smoothquant gives every score.",
    )
    mixed_precision: MixedPrecisionSpec | None = Field(
        None,
        title="Mixed precision",
        description="Sensitive layers out of the recipe's precision: the layers ranked most harmful on the "
        "calibration data are promoted one more at a time until the metric reaches the threshold, at most "
        "max_fraction of them. onnxruntime and academic: their activations and weights at 16 bits (int16/uint16 "
        "Q/DQ, opset 21; the layer runs in float between them); tensorrt platforms and onnxruntime-dynamic, which "
        "take no 16-bit tensors: the layers kept float. The report's mixed_precision section lists them. Not with "
        "a target, a reconstruction or bias_correction.",
    )
    strategy: Literal["fixed", "auto"] = Field(
        "fixed",
        description="fixed: quantize with this recipe. auto: try variations of it (observers, equalization, "
        "bias correction, SmoothQuant, mixed precision, AdaRound) within auto.budget_seconds, score each on "
        "calibration samples held out from their calibration, and keep the best; the report's auto section lists "
        "every candidate.",
    )
    auto: AutoSpec = Field(default_factory=AutoSpec, description="With strategy auto: budget, objective, candidates.")
    weight_only: WeightOnlySpec | None = Field(
        None,
        description="Platform onnxruntime-weight-only only: algorithm, block size, zero points and export format "
        "(null: the defaults there). Embeddings and the LM head stay float unless quantize_embeddings and "
        "quantize_lm_head.",
    )
    platform_named: bool | None = Field(
        None,
        json_schema_extra={"readOnly": True},
        description="Recorded by the service (leave it out): whether the submitted recipe named its platform. A job "
        "that left it out (so tensorrt) and finds no GPU worker also measures the onnxruntime platform's model on "
        "the worker's CPU, and its summary recommends that platform (the report's cpu_alternative).",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds the calibration/evaluation split.")
    preprocessing: PreprocessingSpec | None = Field(
        None,
        description="Image datasets only: how each image becomes the model input: decoded, converted to RGB (or L), "
        "resized, centre-cropped, channels ordered, normalized as (pixel · scale - mean) / std, laid out as NCHW or "
        "NHWC, cast to the input's dtype. Needs center_crop or a two-value resize, so the output size is known.",
    )

    @field_validator("strategy")
    @classmethod
    def _auto_without_target(cls, value: str, info: ValidationInfo) -> str:
        if value == "auto" and info.data.get("target") is not None:
            raise ValueError(
                "strategy auto cannot be combined with a target: set auto.objective instead (when no candidate "
                "meets it, auto keeps the most harmful layers in float as a target does)"
            )
        return value

    @field_validator("strategy")
    @classmethod
    def _auto_without_label_loss(cls, value: str, info: ValidationInfo) -> str:
        qat = info.data.get("qat")
        if value == "auto" and qat is not None and qat.label_weight > 0:
            raise ValueError(
                "strategy auto cannot be combined with qat.label_weight: the search holds some calibration samples "
                "out for its selection and passes no labels on to training"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _record_platform_named(cls, data: Any) -> Any:
        """Record once whether the platform was named: the stored recipe, every field filled in, validates
        again with the value recorded at submission."""
        if isinstance(data, dict) and data.get("platform_named") is None:
            return {**data, "platform_named": "platform" in data}
        return data

    @model_validator(mode="before")
    @classmethod
    def _platform_precision(cls, data: Any) -> Any:
        """A recipe that names no precision gets its platform's first (fp8 on tensorrt-fp8, its only one)."""
        if isinstance(data, dict) and "precision" not in data:
            accepted = PLATFORM_PRECISIONS.get(data.get("platform"))  # type: ignore[arg-type]
            if accepted:
                return {**data, "precision": accepted[0]}
        return data

    def split_sizes(self, num_samples: int) -> tuple[int, int]:
        """(calibration, evaluation) sample counts for a dataset of `num_samples` (>= 2): round(N ·
        holdout_fraction) held out, at least 1, at most N - 1 and evaluation.max_samples; then at most
        calibration.num_samples of the rest calibrate."""
        num_eval = min(max(1, round(num_samples * self.evaluation.holdout_fraction)), num_samples - 1)
        num_eval = min(num_eval, self.evaluation.max_samples)
        return min(num_samples - num_eval, self.calibration.num_samples), num_eval

    def qat_shortfall(self, num_samples: int) -> str | None:
        """Why a dataset of ``num_samples`` leaves too few calibration samples for one QAT training batch
        (None: it does not, or the recipe has no qat)."""
        if self.qat is None or num_samples < 2:
            return None
        return qat_batch_shortfall(self.qat, self.split_sizes(num_samples)[0])

    @field_validator("precision")
    @classmethod
    def _precision_fits_platform(cls, value: str, info: ValidationInfo) -> str:
        platform = info.data.get("platform")
        if platform is None:
            return value
        accepted = PLATFORM_PRECISIONS[platform]
        if accepted is None:
            if value == "fp8":
                raise ValueError("fp8 needs platform tensorrt-fp8")
            if value in PLATFORM_PRECISIONS[WEIGHT_ONLY_PLATFORM]:
                raise ValueError(f"the weight-only precision {value} needs platform {WEIGHT_ONLY_PLATFORM}")
        elif value not in accepted:
            hint = " (fp8 needs platform tensorrt-fp8)" if value == "fp8" else ""
            raise ValueError(f"platform {platform} accepts precision {' or '.join(accepted)}, not {value}{hint}")
        return value

    @field_validator("overrides")
    @classmethod
    def _bits_need_integer(cls, value: list[NodeOverrideSpec], info: ValidationInfo) -> list[NodeOverrideSpec]:
        if info.data.get("precision") == "fp8" and any(o.bits is not None for o in value):
            raise ValueError("bits cannot be overridden with precision fp8 (FP8 has one width)")
        return value

    @field_validator("reduce_range")
    @classmethod
    def _reduce_range_is_for_onnxruntime(cls, value: str, info: ValidationInfo) -> str:
        platform = info.data.get("platform")
        if value != "auto" and platform is not None and platform not in ONNXRUNTIME_PLATFORMS:
            raise ValueError(
                f"reduce_range applies to the platforms {', '.join(ONNXRUNTIME_PLATFORMS)} only, not {platform}"
            )
        return value

    @field_validator("deploy")
    @classmethod
    def _cpu_objective_fits_platform(cls, value: DeploySpec, info: ValidationInfo) -> DeploySpec:
        """A left-out cpu_objective becomes the platform's (latency on onnxruntime); latency elsewhere is refused."""
        platform = info.data.get("platform")
        if value.cpu_objective is None:
            return value.model_copy(update={"cpu_objective": "latency" if platform == "onnxruntime" else "accuracy"})
        if value.cpu_objective == "latency" and platform is not None and platform != "onnxruntime":
            raise ValueError(f"cpu_objective latency needs platform onnxruntime, not {platform}")
        return value

    @field_validator("reconstruction")
    @classmethod
    def _reconstruction_without_target(
        cls, value: ReconstructionSpec | None, info: ValidationInfo
    ) -> ReconstructionSpec | None:
        if value is not None and value.method != "none" and info.data.get("target") is not None:
            raise ValueError(
                "reconstruction cannot be combined with a target yet: the target search re-calibrates each "
                "candidate and would discard the learned rounding"
            )
        return value

    @field_validator("qat")
    @classmethod
    def _qat_fits(cls, value: QatSpec | None, info: ValidationInfo) -> QatSpec | None:
        """Not with a target (which re-calibrates), and a training batch must fit the calibration samples."""
        if value is None:
            return value
        if info.data.get("target") is not None:
            raise ValueError("qat cannot be combined with a target: the target search re-calibrates each candidate")
        calibration = info.data.get("calibration")
        shortfall = qat_batch_shortfall(value, value.num_samples if calibration is None else calibration.num_samples)
        if shortfall is not None:
            raise ValueError(shortfall)
        return value

    @field_validator("weight_only")
    @classmethod
    def _weight_only_platform(cls, value: WeightOnlySpec | None, info: ValidationInfo) -> WeightOnlySpec | None:
        platform = info.data.get("platform")
        if value is not None and platform is not None and platform != WEIGHT_ONLY_PLATFORM:
            raise ValueError(f"weight_only needs platform {WEIGHT_ONLY_PLATFORM}, not {platform}")
        return value

    @model_validator(mode="after")
    def _weight_only_options(self) -> Recipe:
        """The weight-only platform runs no Q/DQ stage: their options are refused, not silently ignored."""
        if self.platform != WEIGHT_ONLY_PLATFORM:
            return self
        refused = [
            name
            for name, set_ in (
                ("target", self.target is not None),
                ("reconstruction", self.reconstruction is not None and self.reconstruction.method != "none"),
                ("qat", self.qat is not None),
                ("equalization", self.equalization),
                ("bias_correction", self.bias_correction),
                ("smoothquant", self.smoothquant),
                ("mixed_precision", self.mixed_precision is not None),
                ("strategy auto", self.strategy == "auto"),
                ("overrides.bits", any(o.bits is not None for o in self.overrides)),
            )
            if set_
        ]
        if refused:
            raise ValueError(
                f"platform {WEIGHT_ONLY_PLATFORM} quantizes weights only: {', '.join(refused)} do not apply"
            )
        return self

    @field_validator("mixed_precision")
    @classmethod
    def _mixed_precision_alone(
        cls, value: MixedPrecisionSpec | None, info: ValidationInfo
    ) -> MixedPrecisionSpec | None:
        """Not after the options that re-annotate, or learn for, the layers as first quantized."""
        if value is None:
            return value
        reconstruction = info.data.get("reconstruction")
        for name, set_, why in (
            ("a target", info.data.get("target") is not None, "it re-annotates and keeps layers float its own way"),
            (
                "a reconstruction",
                reconstruction is not None and reconstruction.method != "none",
                "a promoted layer would lose the rounding learned for its 8-bit grid",
            ),
            (
                "bias_correction",
                bool(info.data.get("bias_correction")),
                "a layer kept float would keep the correction of a quantization it no longer has",
            ),
        ):
            if set_:
                raise ValueError(f"mixed_precision cannot be combined with {name}: {why}")
        return value

    @field_validator("bias_correction")
    @classmethod
    def _bias_correction_without_target(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("target") is not None:
            raise ValueError(
                "bias_correction cannot be combined with a target: a layer the target keeps in float would keep "
                "the correction of a weight quantization it no longer has"
            )
        return value
