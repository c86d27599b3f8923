"""One run's options: `QuantizeConfig`, a frozen dataclass that validates itself in
``__post_init__``; a bad value raises ``ValueError`` naming the field. (One tensor's quantization
is `quantcore.tqc.TensorQuantConfig`; per-node user choices are `NodeOverride`.)
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any

from quantcore.analysis_config import AccuracyTarget, AnalysisOptions
from quantcore.checks import require_bool, require_choice, require_int, string_tuple
from quantcore.cpu_features import REDUCE_RANGE_CHOICES
from quantcore.observers import ACTIVATION_OBSERVERS
from quantcore.platforms import PLATFORMS
from quantcore.precision import MAX_BITS, MIN_BITS, Precision, parse_precision

PLATFORM_NAMES = tuple(PLATFORMS)
DEVICES = ("cpu", "cuda")


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


@dataclass(frozen=True)
class QuantizeConfig:
    """Options of one quantization run.

    platform: rule set placing Q/DQ (``quantcore.platforms``: tensorrt, tensorrt-fp8, onnxruntime,
    academic). precision: ``int8`` | ``fp8`` | ``wXaY`` (``quantcore.precision``), accepted per
    platform (fp8 only on tensorrt-fp8; wXaY other than w8a8 only on academic).
    observer: how activation ranges are derived (``quantcore.observers``; ``percentile`` takes
    amax = the ``percentile``-th percentile of |x|). batch_size: samples per ONNX Runtime run (a fixed
    batch dimension in the model wins). exclude_op_types / exclude_node_patterns: nodes kept in float,
    by op type or by fnmatch pattern over node names. overrides: per-node bits / observer.
    reduce_range: ``auto`` (7-bit weights on the onnxruntime platform when this CPU's u8s8 kernels
    saturate, see ``quantcore.cpu_features``), ``on``, ``off``. device: ``cpu`` or ``cuda``.
    cpu_latency: measure FP32 vs quantized latency on ONNX Runtime's CPU EP (stage ``latency``).
    tensorrt_engine: build a TensorRT engine from the QDQ model (stage ``engine``; ``skipped`` with
    the reason where CUDA or TensorRT is missing). analysis: what the layer-wise analysis may spend
    (``quantcore.analysis_config``). target: an accuracy the run must reach by keeping the most
    harmful layers in float (``quantcore.accuracy_target``); None: quantize everything the rules allow.
    """

    platform: str = "tensorrt"
    precision: str = "int8"
    observer: str = "percentile"
    percentile: float = 99.99
    batch_size: int = 16
    exclude_op_types: tuple[str, ...] = ()
    exclude_node_patterns: tuple[str, ...] = ()
    overrides: tuple[NodeOverride, ...] = ()
    reduce_range: str = "auto"
    device: str = "cpu"
    cpu_latency: bool = True
    tensorrt_engine: bool = False
    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)
    target: AccuracyTarget | None = None

    def __post_init__(self) -> None:
        require_choice("platform", self.platform, PLATFORM_NAMES)
        parse_precision(self.precision)
        if not PLATFORMS[self.platform].accepts(self.precision):
            accepted = PLATFORMS[self.platform].precisions or ("int8", "wXaY")
            raise ValueError(
                f"precision {self.precision!r} is not available on platform {self.platform!r} "
                f"(it accepts {', '.join(accepted)})"
            )
        require_choice("observer", self.observer, ACTIVATION_OBSERVERS)
        require_choice("device", self.device, DEVICES)
        require_choice("reduce_range", self.reduce_range, REDUCE_RANGE_CHOICES)
        require_bool("cpu_latency", self.cpu_latency)
        require_bool("tensorrt_engine", self.tensorrt_engine)
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)):
            raise ValueError(f"percentile must be a number, got {self.percentile!r}")
        if not (math.isfinite(self.percentile) and 0.0 < self.percentile <= 100.0):
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")
        object.__setattr__(self, "percentile", float(self.percentile))
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
            "batch_size": self.batch_size,
            "exclude_op_types": list(self.exclude_op_types),
            "exclude_node_patterns": list(self.exclude_node_patterns),
            "overrides": [o.to_dict() for o in self.overrides],
            "reduce_range": self.reduce_range,
            "device": self.device,
            "cpu_latency": self.cpu_latency,
            "tensorrt_engine": self.tensorrt_engine,
            "analysis": self.analysis.to_dict(),
            "target": None if self.target is None else self.target.to_dict(),
        }
