"""One run's options: ``QuantizeConfig``, a frozen dataclass that validates itself in ``__post_init__``; a
bad value raises ``ValueError`` naming the field. Per-node user choices are ``NodeOverride``. (One tensor's
quantization is ``quantcore.numerics.tqc.TensorQuantConfig``.)"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any

from quantcore.checks import require_bool, require_choice, require_int, require_range, string_tuple
from quantcore.config.analysis import AccuracyTarget, AnalysisOptions
from quantcore.config.auto import AutoOptions
from quantcore.config.choices import (
    CLIPS,
    CPU_OBJECTIVES,
    DEVICES,
    MAX_CPU_BATCH,
    MAX_TIMING_SHARE,
    MIN_TIMING_SHARE,
    MIXED_PRECISION_FORMS,
    PLATFORM_NAMES,
    PLATFORM_PRECISIONS,
    STRATEGIES,
    WEIGHT_ONLY_PLATFORM,
    PlatformName,
    accepts_precision,
    default_precision,
)
from quantcore.config.mixed_precision import MixedPrecisionConfig
from quantcore.config.qat import QatConfig
from quantcore.config.reconstruction import ReconstructionConfig
from quantcore.config.weight_only import WeightOnlyConfig
from quantcore.numerics.precision import MAX_BITS, MIN_BITS, Precision, parse_precision
from quantcore.observers.registry import ACTIVATION_OBSERVERS
from quantcore.runtime.cpu_features import REDUCE_RANGE_CHOICES


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
    uint8 where u8s8 kernels saturate). device: ``cpu``, ``cuda`` or ``auto`` (``quantcore.runtime.device``).
    disabled_optimizers: ONNX Runtime graph rewrites (``disabled_optimizers`` names) the deployed
    session skips; set by the parity check when a rewrite of the installed ONNX Runtime changes the
    model's results (``quantcore.evaluate.parity``), and what users of the model must skip too.
    reconstruction: learned rounding after calibration (``ReconstructionConfig``), None for none.
    qat: quantization-aware training of the whole graph by distillation from the FP32 model, after
    calibration and reconstruction, before export (``QatConfig``, ``quantcore.qat``), None for none.
    equalization: cross-layer equalization of the prepared model (``quantcore.prepare.equalization``):
    consecutive Conv/Gemm pairs rescaled per channel to equal weight ranges, the same FP32 function.
    bias_correction: after calibration, each quantized Conv/Gemm's bias minus the mean shift its
    weight quantization causes on the calibration data (``quantcore.calibrate.bias_correction``); not
    with ``target``, which may keep a corrected layer in float.
    smoothquant: SmoothQuant of the prepared model (``quantcore.calibrate.smoothquant``): MatMul/Gemm and
    Conv inputs with outlier channels divided per channel by s and the weights reading each channel
    multiplied by it, the same FP32 function, alpha chosen by the quantized model's SQNR on calibration
    samples held out of its calibration, and kept only where it beats the unsmoothed model beyond their
    noise (the report's ``prepare.smoothquant``).
    mixed_precision: promote the layers the layer-wise ranking of the calibration data finds most harmful
    (``MixedPrecisionConfig``; ``quantcore.analysis.mixed_precision``), as the platform allows
    (``MIXED_PRECISION_FORMS``): their tensors to 16 bits, or the layers kept float; the promotions land in
    ``wide_tensors`` or ``exclude_node_patterns`` of the report's config. Not with ``target``,
    ``reconstruction`` or ``bias_correction`` (each re-annotates, or is learned for, the layers as first quantized).
    wide_tensors: tensors (activations and weights) quantized at 16 bits (int16/uint16 Q/DQ) instead of the
    precision's width, an activation with the tensors sharing its scale (``quantcore.annotate.widening``); only
    on the platforms whose mixed-precision form is ``int16``.
    cpu_latency: measure FP32 vs quantized latency on ONNX Runtime's CPU EP (stage ``latency``).
    tensorrt_engine: build a TensorRT engine from the QDQ model (stage ``engine``; ``skipped`` with
    the reason where CUDA or TensorRT is missing). analysis: what the layer-wise analysis may spend
    (``quantcore.config``). target: an accuracy the run must reach by keeping the most
    harmful layers in float (``quantcore.analysis.accuracy_target``); None: quantize everything the rules allow.
    cpu_objective: ``accuracy`` (the default: no placement), ``size`` (the same: every region the rules
    quantize stays quantized) or ``latency`` (platform onnxruntime only: regions that run slower quantized
    than float on this CPU are kept float, stage ``place``). cpu_threads: ONNX Runtime intra-op threads for
    the placement's and the latency stage's measurements (None: every core this process may use).
    cpu_batch_sizes: the batch sizes both measure at. cpu_timing_share: the placement's timing runs, as a
    multiple of the calibrate stage's seconds (``quantcore.analysis.placement``): a larger share
    lets it check more rounds where a first profile takes the whole budget. cpu_timing_cache: a directory
    where the placement keeps its timings between runs (None: not kept); where timings are kept changes no
    result, so it is left out of ``to_dict`` (the report's config, the resume checkpoint's fingerprint).
    cpu_alternative: when the engine stage is skipped (no TensorRT engine for this model), also quantize
    the prepared model with the onnxruntime platform's rules and measure it on this CPU beside the model
    kept (stage ``cpu_alternative``, ``quantcore.pipeline.cpu_alternative``); a service sets it for a recipe that
    left the default tensorrt platform unnamed. It adds a report section and changes no file, so it is left
    out of ``to_dict`` too.
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
    device: str = "auto"
    disabled_optimizers: tuple[str, ...] = ()
    cpu_latency: bool = True
    tensorrt_engine: bool = False
    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)
    target: AccuracyTarget | None = None
    reconstruction: ReconstructionConfig | None = None
    qat: QatConfig | None = None
    equalization: bool = False
    bias_correction: bool = False
    smoothquant: bool = False
    mixed_precision: MixedPrecisionConfig | None = None
    wide_tensors: tuple[str, ...] = ()
    strategy: str = "fixed"
    auto: AutoOptions = field(default_factory=AutoOptions)
    cpu_objective: str = "accuracy"
    cpu_threads: int | None = None
    cpu_batch_sizes: tuple[int, ...] = (1, 32)
    cpu_timing_share: float = 1.0
    cpu_timing_cache: str | None = None
    cpu_alternative: bool = False
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
        require_bool("cpu_alternative", self.cpu_alternative)
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
        if self.qat is not None and not isinstance(self.qat, QatConfig):
            raise ValueError(f"qat must be a QatConfig or None, got {self.qat!r}")
        if self.qat is not None and self.target is not None:
            raise ValueError("qat and target cannot be combined (the target search re-calibrates)")
        if self.bias_correction and self.target is not None:
            raise ValueError(
                "bias_correction and target cannot be combined (a layer the target keeps in float would keep "
                "the correction of a weight quantization it no longer has)"
            )
        self._check_mixed_precision()
        require_choice("strategy", self.strategy, STRATEGIES)
        if not isinstance(self.auto, AutoOptions):
            raise ValueError(f"auto must be an AutoOptions, got {self.auto!r}")
        if self.strategy == "auto" and self.target is not None:
            raise ValueError("strategy 'auto' and target cannot be combined (auto falls back to a target of its own)")
        require_choice("cpu_objective", self.cpu_objective, CPU_OBJECTIVES)
        if self.cpu_objective == "latency" and self.platform != "onnxruntime":
            raise ValueError(f"cpu_objective 'latency' needs platform 'onnxruntime', not {self.platform!r}")
        if self.cpu_threads is not None:
            require_range("cpu_threads", self.cpu_threads, 1, 1024, integer=True)
        if isinstance(self.cpu_batch_sizes, (str, int)) or not self.cpu_batch_sizes:
            raise ValueError(f"cpu_batch_sizes must be a non-empty tuple of integers, got {self.cpu_batch_sizes!r}")
        for batch in self.cpu_batch_sizes:
            require_range("cpu_batch_sizes", batch, 1, MAX_CPU_BATCH, integer=True)
        object.__setattr__(self, "cpu_batch_sizes", tuple(sorted(set(self.cpu_batch_sizes))))
        require_range("cpu_timing_share", self.cpu_timing_share, MIN_TIMING_SHARE, MAX_TIMING_SHARE)
        if self.cpu_timing_cache is not None and not isinstance(self.cpu_timing_cache, str):
            raise ValueError(f"cpu_timing_cache must be a directory path string or None, got {self.cpu_timing_cache!r}")
        self._check_weight_only()

    def _check_mixed_precision(self) -> None:
        """mixed_precision's type and the options it cannot follow; wide_tensors where 16 bits run."""
        object.__setattr__(self, "wide_tensors", string_tuple("wide_tensors", self.wide_tensors))
        if self.wide_tensors and MIXED_PRECISION_FORMS.get(self.platform) != "int16":
            raise ValueError(
                f"wide_tensors: platform {self.platform!r} takes no 16-bit tensors (its runtime does not run them; "
                "mixed precision keeps its sensitive layers float instead)"
            )
        if self.mixed_precision is None:
            return
        if not isinstance(self.mixed_precision, MixedPrecisionConfig):
            raise ValueError(f"mixed_precision must be a MixedPrecisionConfig or None, got {self.mixed_precision!r}")
        for name, why in (
            ("target", "the target search re-annotates the model and keeps layers float its own way"),
            ("reconstruction", "a promoted layer would lose the rounding learned for its 8-bit grid"),
            ("bias_correction", "a layer kept float would keep the correction of a quantization it no longer has"),
        ):
            if getattr(self, name) not in (None, False):
                raise ValueError(f"mixed_precision and {name} cannot be combined ({why})")

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
        for name in ("target", "reconstruction", "qat", "mixed_precision"):
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
            "qat": None if self.qat is None else self.qat.to_dict(),
            "equalization": self.equalization,
            "bias_correction": self.bias_correction,
            "smoothquant": self.smoothquant,
            "mixed_precision": None if self.mixed_precision is None else self.mixed_precision.to_dict(),
            "wide_tensors": list(self.wide_tensors),
            "strategy": self.strategy,
            "auto": self.auto.to_dict(),
            "cpu_objective": self.cpu_objective,
            "cpu_threads": self.cpu_threads,
            "cpu_batch_sizes": list(self.cpu_batch_sizes),
            "cpu_timing_share": self.cpu_timing_share,
            "weight_only": None if self.weight_only is None else self.weight_only.to_dict(),
        }
