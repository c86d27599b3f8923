"""One run's options: `QuantizeConfig`, a frozen dataclass that validates itself in
``__post_init__``; a bad value raises ``ValueError`` naming the field. (One tensor's quantization
is `quantcore.tqc.TensorQuantConfig`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quantcore.checks import require_choice, require_int, string_tuple
from quantcore.observers import ACTIVATION_OBSERVERS

PLATFORM_NAMES = ("tensorrt",)  # keys of quantcore.platforms.PLATFORMS (a test keeps them equal)
PRECISIONS = ("int8",)
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class QuantizeConfig:
    """Options of one quantization run.

    platform: rule set placing Q/DQ (``tensorrt``: int8 symmetric, per-channel weights on the
    output-channel axis, per-tensor activations).  observer: how activation ranges are derived,
    ``minmax`` (amax = max|x|) or ``percentile`` (amax = the ``percentile``-th percentile of |x|).
    batch_size: samples per ONNX Runtime run (a fixed batch dimension in the model wins).
    exclude_op_types / exclude_node_patterns: nodes kept in float, by op type or by fnmatch pattern
    over node names.  device: ``cpu`` or ``cuda`` (ONNX Runtime execution provider).
    """

    platform: str = "tensorrt"
    precision: str = "int8"
    observer: str = "percentile"
    percentile: float = 99.99
    batch_size: int = 16
    exclude_op_types: tuple[str, ...] = ()
    exclude_node_patterns: tuple[str, ...] = ()
    device: str = "cpu"

    def __post_init__(self) -> None:
        require_choice("platform", self.platform, PLATFORM_NAMES)
        require_choice("precision", self.precision, PRECISIONS)
        require_choice("observer", self.observer, ACTIVATION_OBSERVERS)
        require_choice("device", self.device, DEVICES)
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "precision": self.precision,
            "observer": self.observer,
            "percentile": self.percentile,
            "batch_size": self.batch_size,
            "exclude_op_types": list(self.exclude_op_types),
            "exclude_node_patterns": list(self.exclude_node_patterns),
            "device": self.device,
        }
