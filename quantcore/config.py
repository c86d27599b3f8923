"""One run's options: `QuantizeConfig`, a frozen dataclass that validates itself in
``__post_init__``; a bad value raises ``ValueError`` naming the field. (One tensor's quantization
is `quantcore.numerics.tqc.TensorQuantConfig`; per-node user choices are `NodeOverride`.) Beside it, the
options of the layer-wise analysis (``AnalysisOptions``) and of the accuracy-target mode (``AccuracyTarget``).

Target metrics (``TARGET_METRICS``), each measured on the evaluation data, on the exported model as
deployed on ONNX Runtime (exact Q/DQ when the deployed session could not be built):

    top1_drop   FP32 top-1 minus quantized top-1, in percentage points; met when <= threshold (labels needed)
    cosine      the lowest output cosine to FP32;                        met when >= threshold
    sqnr        the lowest output SQNR (dB) to FP32;                     met when >= threshold
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from quantcore.checks import require_bool, require_choice, require_int, require_seconds, string_tuple
from quantcore.numerics.precision import MAX_BITS, MIN_BITS, Precision, parse_precision
from quantcore.observers.registry import ACTIVATION_OBSERVERS
from quantcore.runtime.cpu_features import REDUCE_RANGE_CHOICES

# The platforms a run may name: the keys of ``quantcore.annotate.platforms.PLATFORMS``, whose rule sets sit
# above config (they read it); a test pins the two together.
PlatformName = Literal[
    "tensorrt", "tensorrt-fp8", "onnxruntime", "onnxruntime-dynamic", "onnxruntime-weight-only", "academic"
]
PLATFORM_NAMES: tuple[PlatformName, ...] = get_args(PlatformName)
# platform -> the precisions it accepts, its default first; None: int8 and any integer wXaY. Here, not in
# the platforms' rule sets, so that a run's precision is checked and defaulted with its other options.
PLATFORM_PRECISIONS: dict[PlatformName, tuple[str, ...] | None] = {
    "tensorrt": ("int8", "w8a8"),
    "tensorrt-fp8": ("fp8",),
    "onnxruntime": ("int8", "w8a8"),
    "onnxruntime-dynamic": ("int8", "w8a8"),  # DynamicQuantizeLinear is uint8 only
    "onnxruntime-weight-only": ("w4", "w8"),  # activations stay float (``WeightOnlyConfig``)
    "academic": None,
}
WEIGHT_ONLY_PLATFORM: PlatformName = "onnxruntime-weight-only"
WEIGHT_ONLY_ALGORITHMS = ("rtn", "gptq")
WEIGHT_ONLY_FORMATS = ("matmulnbits", "dequantize_linear")
WEIGHT_ONLY_BLOCK_SIZES = (16, 256)  # a power of two in this range
DEVICES = ("cpu", "cuda")
CLIPS = ("percentile", "mse")  # where a percentile-observed tensor is clipped (QuantizeConfig.clip)
RECONSTRUCTION_METHODS = ("adaround", "brecq", "qdrop")
MAX_RECONSTRUCTION_ITERS = 100_000
# fixed: the run quantizes with the config as given (``quantcore.quantize``); auto: a search tries variations
# of it and keeps the best (``quantcore.auto.quantize_auto``, settings ``AutoOptions``).
STRATEGIES = ("fixed", "auto")
# The candidates the auto search may try, cheapest first: the names of ``quantcore.auto.candidates.CANDIDATES``,
# which sit above config (they build configs); a test pins the two together.
AUTO_CANDIDATES = (
    "as_given",
    "minmax",
    "mse",
    "kl",
    "floating",
    "equalization",
    "bias_correction",
    "smoothquant",
    "adaround",
)
AUTO_BUDGET_SECONDS = (10.0, 86_400.0)
# What the onnxruntime platform's deployment favours (``QuantizeConfig.cpu_objective``): latency places
# quantized regions by measured speed (``quantcore.analysis.placement``); accuracy and size keep every
# region the rules quantize (no placement: the export is that of a run without the option).
CPU_OBJECTIVES = ("accuracy", "latency", "size")
MAX_CPU_BATCH = 4096


def default_precision(platform: PlatformName) -> str:
    """The precision a run gets when it names none: the platform's first, int8 where it takes any."""
    accepted = PLATFORM_PRECISIONS[platform]
    return accepted[0] if accepted else "int8"


def accepts_precision(platform: PlatformName, precision: str) -> bool:
    """Whether ``platform`` runs ``precision`` (a valid precision name, see ``PLATFORM_PRECISIONS``)."""
    accepted = PLATFORM_PRECISIONS[platform]
    if accepted is None:
        spec = parse_precision(precision)
        return not (spec.floating or spec.weight_only)
    return precision in accepted


def _require_range(name: str, value: object, lo: float, hi: float, *, integer: bool = False) -> None:
    """``lo <= value <= hi`` (an int when ``integer``), else ValueError naming the field."""
    if integer:
        require_int(name, value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


# metric -> True when higher values are better (the threshold is a floor), False when it is a ceiling
TARGET_METRICS: dict[str, bool] = {"top1_drop": False, "cosine": True, "sqnr": True}


@dataclass(frozen=True)
class AnalysisOptions:
    """What the layer-wise analysis (``quantcore.analysis.ranking``) may spend.

    enabled: run it at all (the accuracy-target mode runs it regardless: it needs the ranking).
    graphwise_samples: evaluation samples for the per-tensor SQNR and range statistics (None: all).
    layerwise_samples: evaluation samples for the one-layer-at-a-time runs; their cost is
    layers x samples forward passes, so this is the bound that matters on big models.
    max_layers: at most this many layers get a layer-wise run, those whose own quantization loses the
    most (lowest local SQNR at their inputs); the others are listed without a layer-wise figure.
    layerwise_seconds: the layer-wise runs are held to about this long (None: no limit), priced by a run
    of the first sample: fewer samples, and where one sample over every layer would take longer, fewer
    layers (chosen as by ``max_layers``).
    """

    enabled: bool = True
    graphwise_samples: int | None = None
    layerwise_samples: int = 64
    max_layers: int = 256
    layerwise_seconds: float | None = 120.0

    def __post_init__(self) -> None:
        require_bool("analysis.enabled", self.enabled)
        if self.graphwise_samples is not None:
            require_int("analysis.graphwise_samples", self.graphwise_samples)
            if self.graphwise_samples < 1:
                raise ValueError(f"analysis.graphwise_samples must be >= 1, got {self.graphwise_samples}")
        for name in ("layerwise_samples", "max_layers"):
            value = getattr(self, name)
            require_int(f"analysis.{name}", value)
            if value < 1:
                raise ValueError(f"analysis.{name} must be >= 1, got {value}")
        require_seconds("analysis.layerwise_seconds", self.layerwise_seconds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "graphwise_samples": self.graphwise_samples,
            "layerwise_samples": self.layerwise_samples,
            "max_layers": self.max_layers,
            "layerwise_seconds": self.layerwise_seconds,
        }


@dataclass(frozen=True)
class AccuracyTarget:
    """The accuracy a job must reach (see the module table). max_float_layers: at most this many
    layers may be kept in float (None: as many as it takes)."""

    metric: str
    threshold: float
    max_float_layers: int | None = None

    def __post_init__(self) -> None:
        require_choice("target.metric", self.metric, tuple(TARGET_METRICS))
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            raise ValueError(f"target.threshold must be a number, got {self.threshold!r}")
        if not math.isfinite(self.threshold):
            raise ValueError(f"target.threshold must be finite, got {self.threshold}")
        if self.metric == "cosine" and not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"target.threshold for cosine must be in [-1, 1], got {self.threshold}")
        object.__setattr__(self, "threshold", float(self.threshold))
        if self.max_float_layers is not None:
            require_int("target.max_float_layers", self.max_float_layers)
            if self.max_float_layers < 1:
                raise ValueError(f"target.max_float_layers must be >= 1, got {self.max_float_layers}")

    @property
    def higher_is_better(self) -> bool:
        return TARGET_METRICS[self.metric]

    def met(self, value: float | None) -> bool:
        """True when ``value`` satisfies the target (None, an unmeasurable metric, never does)."""
        if value is None:
            return False
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def statement(self) -> str:
        """The target in words, e.g. ``cosine >= 0.999``."""
        unit = " points" if self.metric == "top1_drop" else " dB" if self.metric == "sqnr" else ""
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.threshold:.10g}{unit}"

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "threshold": self.threshold, "max_float_layers": self.max_float_layers}


@dataclass(frozen=True)
class AutoOptions:
    """What ``strategy="auto"`` may try and spend (``quantcore.auto``).

    budget_seconds: wall-clock seconds for the search's candidates, in [10, 86400] (the first candidate,
    the config as given, always runs whole; the final run with the chosen config comes on top).
    objective: the accuracy a candidate must reach on the selection split (an ``AccuracyTarget``, its
    ``max_float_layers`` bounding the fallback search); default: the worst float output's cosine to FP32
    >= 0.99. candidates: names from ``AUTO_CANDIDATES`` to try, in that list's order whatever the order
    given; None: every one that applies to the platform.
    """

    budget_seconds: float = 900.0
    objective: AccuracyTarget = field(default_factory=lambda: AccuracyTarget("cosine", 0.99))
    candidates: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _require_range("auto.budget_seconds", self.budget_seconds, *AUTO_BUDGET_SECONDS)
        object.__setattr__(self, "budget_seconds", float(self.budget_seconds))
        if not isinstance(self.objective, AccuracyTarget):
            raise ValueError(f"auto.objective must be an AccuracyTarget, got {self.objective!r}")
        if self.candidates is not None:
            names = string_tuple("auto.candidates", self.candidates)
            for name in names:
                require_choice("auto.candidates", name, AUTO_CANDIDATES)
            if not names:
                raise ValueError("auto.candidates must name at least one candidate (None: all that apply)")
            object.__setattr__(self, "candidates", names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_seconds": self.budget_seconds,
            "objective": self.objective.to_dict(),
            "candidates": None if self.candidates is None else list(self.candidates),
        }


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
        _require_range("reconstruction.iters", self.iters, 1, MAX_RECONSTRUCTION_ITERS, integer=True)
        _require_range("reconstruction.batch_size", self.batch_size, 1, 4096, integer=True)
        _require_range("reconstruction.num_samples", self.num_samples, 1, 1_000_000, integer=True)
        if self.weight_lr is not None:
            _require_range("reconstruction.weight_lr", self.weight_lr, 1e-8, 1.0)
        _require_range("reconstruction.activation_lr", self.activation_lr, 0.0, 1.0)
        _require_range("reconstruction.rounding_loss_weight", self.rounding_loss_weight, 0.0, 100.0)
        _require_range("reconstruction.warmup", self.warmup, 0.0, 1.0)
        _require_range("reconstruction.beta_start", self.beta_start, 1.0, 100.0)
        _require_range("reconstruction.beta_end", self.beta_end, 1.0, 100.0)
        if self.beta_end > self.beta_start:
            raise ValueError(
                f"reconstruction.beta_end ({self.beta_end}) must not exceed beta_start ({self.beta_start})"
            )
        _require_range("reconstruction.drop_prob", self.drop_prob, 0.0, 1.0)
        _require_range("reconstruction.cache_bytes", self.cache_bytes, 0, 2**40, integer=True)
        _require_range("reconstruction.seed", self.seed, 0, 2**63 - 1, integer=True)
        _require_range("reconstruction.threads", self.threads, 0, 1024, integer=True)

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


@dataclass(frozen=True)
class WeightOnlyConfig:
    """Weight-only quantization of MatMul/Gemm weights (platform ``onnxruntime-weight-only``,
    ``quantcore.weight_only``); the bits are the precision's (``w4``, ``w8``).

    algorithm: ``rtn`` (round to nearest) or ``gptq`` (Frantar et al. 2022: column by column with the
    rounding error compensated through H = 2·XᵀX/n of the calibration data). block_size: weights per
    scale along the reduction axis K, a power of two in [16, 256]; K need not be a multiple (the last
    block is padded with zeros, as MatMulNBits pads). symmetric: zero point fixed at 2^(bits-1) (codes
    stored signed in ``dequantize_linear``), else a zero point per block. format: ``matmulnbits``
    (``com.microsoft.MatMulNBits``, ONNX Runtime's CPU kernel) or ``dequantize_linear`` (opset-21 blocked
    DequantizeLinear of int4/uint4/int8/uint8 codes before the float MatMul/Gemm; the model is converted
    to opset 21). act_order: GPTQ visits the columns by decreasing H diagonal (the block scales are then
    computed from the original weights first, GPTQ's ``static_groups``, so that blocks stay contiguous).
    damping: λ = damping·mean(diag H) added to H's diagonal. quantize_lm_head: also quantize the last
    MatMul/Gemm writing a graph output (kept float by default: its error reaches the logits unfiltered).
    """

    algorithm: str = "rtn"
    block_size: int = 32
    symmetric: bool = True
    format: str = "matmulnbits"
    act_order: bool = False
    damping: float = 0.01
    quantize_lm_head: bool = False

    def __post_init__(self) -> None:
        require_choice("weight_only.algorithm", self.algorithm, WEIGHT_ONLY_ALGORITHMS)
        _require_range("weight_only.block_size", self.block_size, *WEIGHT_ONLY_BLOCK_SIZES, integer=True)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"weight_only.block_size must be a power of two, got {self.block_size}")
        require_bool("weight_only.symmetric", self.symmetric)
        require_choice("weight_only.format", self.format, WEIGHT_ONLY_FORMATS)
        require_bool("weight_only.act_order", self.act_order)
        _require_range("weight_only.damping", self.damping, 1e-6, 1.0)
        require_bool("weight_only.quantize_lm_head", self.quantize_lm_head)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True)
class NodeOverride:
    """For nodes whose name matches ``pattern`` (fnmatch): quantize their tensors at ``bits`` and/or
    observe their activations with ``observer``. The first matching override sets each field."""

    pattern: str
    bits: int | None = None
    observer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"overrides: pattern must be a non-empty string, got {self.pattern!r}")
        if self.bits is None and self.observer is None:
            raise ValueError(f"overrides[{self.pattern!r}]: set bits and/or observer")
        if self.bits is not None:
            require_int("overrides.bits", self.bits)
            if not MIN_BITS <= self.bits <= MAX_BITS:
                raise ValueError(
                    f"overrides[{self.pattern!r}].bits must be in [{MIN_BITS}, {MAX_BITS}], got {self.bits}"
                )
        if self.observer is not None:
            require_choice("overrides.observer", self.observer, ACTIVATION_OBSERVERS)

    def matches(self, node_name: str) -> bool:
        return fnmatch.fnmatchcase(node_name, self.pattern)

    def to_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "bits": self.bits, "observer": self.observer}


def _percentile(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number, got {value!r}")
    if not (math.isfinite(value) and 0.0 < value <= 100.0):
        raise ValueError(f"{field} must be in (0, 100], got {value}")
    return float(value)


@dataclass(frozen=True)
class QuantizeConfig:
    """Options of one quantization run.

    platform: rule set placing Q/DQ (``quantcore.annotate.platforms``: tensorrt, tensorrt-fp8, onnxruntime,
    onnxruntime-dynamic, academic). precision: ``int8`` | ``fp8`` | ``wXaY`` (``quantcore.numerics.precision``),
    accepted per platform (``PLATFORM_PRECISIONS``: fp8 only on tensorrt-fp8; wXaY other than w8a8 only on
    academic); None (the default): the platform's own, fp8 on tensorrt-fp8 and int8 elsewhere.
    observer: how activation ranges are derived (``quantcore.observers.registry``; ``percentile`` takes
    amax = the ``percentile``-th percentile of |x|). percentile_candidates: other percentiles the run
    tries for the tensors observed by ``percentile``, with the MSE threshold (``clip="mse"``), keeping
    whichever reproduces the FP32 outputs best on the calibration data, given at least 64 samples
    (``quantcore.calibrate.clip_search``; the report's config then holds the one kept); () tries none. clip: where
    a tensor observed by ``percentile`` is clipped: ``percentile``, at that percentile of |x|, or ``mse``,
    at the threshold minimising its quantization error estimated on the same histogram
    (``quantcore.observers.clipping.mse_amax``). batch_size: samples per ONNX Runtime run (a fixed
    batch dimension in the model wins). exclude_op_types / exclude_node_patterns: nodes kept in float,
    by op type or by fnmatch pattern over node names. overrides: per-node bits / observer.
    reduce_range: ``auto`` (7-bit weights on the onnxruntime platforms when this CPU's u8s8 kernels
    saturate, see ``quantcore.runtime.cpu_features``), ``on`` (7-bit), ``off`` (the full int8 grid, stored as
    uint8 where u8s8 kernels saturate). device: ``cpu`` or ``cuda``.
    disabled_optimizers: ONNX Runtime graph rewrites (``disabled_optimizers`` names) the deployed
    session skips; set by the parity check when a rewrite of the installed ONNX Runtime changes the
    model's results (``quantcore.evaluate.parity``), and what users of the model must skip too.
    reconstruction: learned rounding after calibration (``ReconstructionConfig``), None for none.
    equalization: cross-layer equalization of the prepared model (``quantcore.prepare.equalization``):
    consecutive Conv/Gemm pairs rescaled per channel to equal weight ranges, the same FP32 function.
    bias_correction: after calibration, each quantized Conv/Gemm's bias minus the mean shift its
    weight quantization causes on the calibration data (``quantcore.calibrate.bias_correction``); not
    with ``target``, which may keep a corrected layer in float.
    smoothquant: SmoothQuant of the prepared model (``quantcore.calibrate.smoothquant``): MatMul/Gemm inputs
    with outlier channels divided per channel by s and their weights' rows multiplied by it, the same FP32
    function, alpha chosen by the quantized model's SQNR on the calibration data.
    cpu_latency: measure FP32 vs quantized latency on ONNX Runtime's CPU EP (stage ``latency``).
    tensorrt_engine: build a TensorRT engine from the QDQ model (stage ``engine``; ``skipped`` with
    the reason where CUDA or TensorRT is missing). analysis: what the layer-wise analysis may spend
    (``quantcore.config``). target: an accuracy the run must reach by keeping the most
    harmful layers in float (``quantcore.analysis.accuracy_target``); None: quantize everything the rules allow.
    cpu_objective: ``accuracy`` (the default: no placement), ``size`` (the same: every region the rules
    quantize stays quantized) or ``latency`` (platform onnxruntime only: regions that run slower quantized
    than float on this CPU are kept float, stage ``place``). cpu_threads: ONNX Runtime intra-op threads for
    the placement's and the latency stage's measurements (None: every core this process may use).
    cpu_batch_sizes: the batch sizes both measure at. cpu_timing_cache: a directory where the placement
    keeps its timings between runs (None: not kept); where timings are kept changes no result, so it is
    left out of ``to_dict`` (the report's config, the resume checkpoint's fingerprint).
    strategy: ``fixed`` (quantize with this config) or ``auto`` (search variations of it within
    ``auto``'s budget, ``quantcore.auto``; not with ``target``, which is the search's own fallback).
    weight_only: the weight-only options (``WeightOnlyConfig``), only with platform
    ``onnxruntime-weight-only``, which gets the defaults when None; there the run is prepare → annotate →
    calibrate (GPTQ's Hessians) → export → evaluate → latency (``quantcore.pipeline.weight_only``), and the
    options of the Q/DQ stages (observers, clip, reconstruction, target, auto, placement...) do not apply.
    """

    platform: PlatformName = "tensorrt"
    precision: str | None = None
    observer: str = "percentile"
    percentile: float = 99.99
    percentile_candidates: tuple[float, ...] = (99.9, 99.99, 99.999, 100.0)
    clip: str = "percentile"
    batch_size: int = 16
    exclude_op_types: tuple[str, ...] = ()
    exclude_node_patterns: tuple[str, ...] = ()
    overrides: tuple[NodeOverride, ...] = ()
    reduce_range: str = "auto"
    device: str = "cpu"
    disabled_optimizers: tuple[str, ...] = ()
    cpu_latency: bool = True
    tensorrt_engine: bool = False
    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)
    target: AccuracyTarget | None = None
    reconstruction: ReconstructionConfig | None = None
    equalization: bool = False
    bias_correction: bool = False
    smoothquant: bool = False
    strategy: str = "fixed"
    auto: AutoOptions = field(default_factory=AutoOptions)
    cpu_objective: str = "accuracy"
    cpu_threads: int | None = None
    cpu_batch_sizes: tuple[int, ...] = (1, 32)
    cpu_timing_cache: str | None = None
    weight_only: WeightOnlyConfig | None = None

    def __post_init__(self) -> None:
        require_choice("platform", self.platform, PLATFORM_NAMES)
        if self.precision is None:
            object.__setattr__(self, "precision", default_precision(self.platform))
        parse_precision(self.precision)
        if not accepts_precision(self.platform, self.precision):
            accepted = PLATFORM_PRECISIONS[self.platform] or ("int8", "wXaY")
            raise ValueError(
                f"precision {self.precision!r} is not available on platform {self.platform!r} "
                f"(it accepts {', '.join(accepted)})"
            )
        require_choice("observer", self.observer, ACTIVATION_OBSERVERS)
        require_choice("clip", self.clip, CLIPS)
        require_choice("device", self.device, DEVICES)
        object.__setattr__(self, "disabled_optimizers", string_tuple("disabled_optimizers", self.disabled_optimizers))
        require_choice("reduce_range", self.reduce_range, REDUCE_RANGE_CHOICES)
        require_bool("cpu_latency", self.cpu_latency)
        require_bool("tensorrt_engine", self.tensorrt_engine)
        require_bool("equalization", self.equalization)
        require_bool("bias_correction", self.bias_correction)
        require_bool("smoothquant", self.smoothquant)
        object.__setattr__(self, "percentile", _percentile("percentile", self.percentile))
        if isinstance(self.percentile_candidates, (str, int, float)):
            raise ValueError(f"percentile_candidates must be a tuple of numbers, got {self.percentile_candidates!r}")
        object.__setattr__(
            self,
            "percentile_candidates",
            tuple(_percentile("percentile_candidates", p) for p in self.percentile_candidates),
        )
        require_int("batch_size", self.batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        object.__setattr__(self, "exclude_op_types", string_tuple("exclude_op_types", self.exclude_op_types))
        object.__setattr__(
            self, "exclude_node_patterns", string_tuple("exclude_node_patterns", self.exclude_node_patterns)
        )
        if isinstance(self.overrides, (str, NodeOverride)) or not isinstance(self.overrides, (tuple, list)):
            raise ValueError(f"overrides must be a tuple of NodeOverride, got {self.overrides!r}")
        if not all(isinstance(o, NodeOverride) for o in self.overrides):
            raise ValueError("overrides entries must be NodeOverride")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        if not isinstance(self.analysis, AnalysisOptions):
            raise ValueError(f"analysis must be an AnalysisOptions, got {self.analysis!r}")
        if self.target is not None and not isinstance(self.target, AccuracyTarget):
            raise ValueError(f"target must be an AccuracyTarget or None, got {self.target!r}")
        if self.precision == "fp8" and any(o.bits is not None for o in self.overrides):
            raise ValueError("overrides.bits is not available with precision 'fp8' (FP8 has one width)")
        if self.reconstruction is not None and not isinstance(self.reconstruction, ReconstructionConfig):
            raise ValueError(f"reconstruction must be a ReconstructionConfig or None, got {self.reconstruction!r}")
        if self.reconstruction is not None and self.target is not None:
            raise ValueError("reconstruction and target cannot be combined (the target search re-calibrates)")
        if self.bias_correction and self.target is not None:
            raise ValueError(
                "bias_correction and target cannot be combined (a layer the target keeps in float would keep "
                "the correction of a weight quantization it no longer has)"
            )
        require_choice("strategy", self.strategy, STRATEGIES)
        if not isinstance(self.auto, AutoOptions):
            raise ValueError(f"auto must be an AutoOptions, got {self.auto!r}")
        if self.strategy == "auto" and self.target is not None:
            raise ValueError("strategy 'auto' and target cannot be combined (auto falls back to a target of its own)")
        require_choice("cpu_objective", self.cpu_objective, CPU_OBJECTIVES)
        if self.cpu_objective == "latency" and self.platform != "onnxruntime":
            raise ValueError(f"cpu_objective 'latency' needs platform 'onnxruntime', not {self.platform!r}")
        if self.cpu_threads is not None:
            _require_range("cpu_threads", self.cpu_threads, 1, 1024, integer=True)
        if isinstance(self.cpu_batch_sizes, (str, int)) or not self.cpu_batch_sizes:
            raise ValueError(f"cpu_batch_sizes must be a non-empty tuple of integers, got {self.cpu_batch_sizes!r}")
        for batch in self.cpu_batch_sizes:
            _require_range("cpu_batch_sizes", batch, 1, MAX_CPU_BATCH, integer=True)
        object.__setattr__(self, "cpu_batch_sizes", tuple(sorted(set(self.cpu_batch_sizes))))
        if self.cpu_timing_cache is not None and not isinstance(self.cpu_timing_cache, str):
            raise ValueError(f"cpu_timing_cache must be a directory path string or None, got {self.cpu_timing_cache!r}")
        self._check_weight_only()

    def _check_weight_only(self) -> None:
        """weight_only only on its platform (defaulted there), and none of the Q/DQ stages' options with it."""
        if self.platform != WEIGHT_ONLY_PLATFORM:
            if self.weight_only is not None:
                raise ValueError(f"weight_only needs platform {WEIGHT_ONLY_PLATFORM!r}, not {self.platform!r}")
            return
        if self.weight_only is None:
            object.__setattr__(self, "weight_only", WeightOnlyConfig())
        if not isinstance(self.weight_only, WeightOnlyConfig):
            raise ValueError(f"weight_only must be a WeightOnlyConfig or None, got {self.weight_only!r}")
        for name in ("target", "reconstruction"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is not available on platform {WEIGHT_ONLY_PLATFORM!r}")
        for name in ("equalization", "bias_correction", "smoothquant", "tensorrt_engine"):
            if getattr(self, name):
                raise ValueError(f"{name} is not available on platform {WEIGHT_ONLY_PLATFORM!r}")
        if self.strategy != "fixed":
            raise ValueError(f"strategy {self.strategy!r} is not available on platform {WEIGHT_ONLY_PLATFORM!r}")
        if any(o.bits is not None for o in self.overrides):
            raise ValueError(f"overrides.bits is not available on platform {WEIGHT_ONLY_PLATFORM!r} (one width)")

    @property
    def precision_spec(self) -> Precision:
        """The parsed precision (weight and activation bit widths)."""
        return parse_precision(self.precision)

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "precision": self.precision,
            "observer": self.observer,
            "percentile": self.percentile,
            "percentile_candidates": list(self.percentile_candidates),
            "clip": self.clip,
            "batch_size": self.batch_size,
            "exclude_op_types": list(self.exclude_op_types),
            "exclude_node_patterns": list(self.exclude_node_patterns),
            "overrides": [o.to_dict() for o in self.overrides],
            "reduce_range": self.reduce_range,
            "device": self.device,
            "disabled_optimizers": list(self.disabled_optimizers),
            "cpu_latency": self.cpu_latency,
            "tensorrt_engine": self.tensorrt_engine,
            "analysis": self.analysis.to_dict(),
            "target": None if self.target is None else self.target.to_dict(),
            "reconstruction": None if self.reconstruction is None else self.reconstruction.to_dict(),
            "equalization": self.equalization,
            "bias_correction": self.bias_correction,
            "smoothquant": self.smoothquant,
            "strategy": self.strategy,
            "auto": self.auto.to_dict(),
            "cpu_objective": self.cpu_objective,
            "cpu_threads": self.cpu_threads,
            "cpu_batch_sizes": list(self.cpu_batch_sizes),
            "weight_only": None if self.weight_only is None else self.weight_only.to_dict(),
        }
