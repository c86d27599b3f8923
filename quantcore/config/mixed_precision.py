"""Options of mixed precision for sensitive tensors (``quantcore.analysis.mixed_precision``): how many layers
may leave the run's precision, and the accuracy that stops the promotion."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantcore.checks import require_range
from quantcore.config.analysis import AccuracyTarget
from quantcore.config.choices import MIXED_PRECISION_FRACTION, MIXED_PRECISION_METRICS


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Promote the layers the ranking finds most harmful, one more at a time, until ``objective`` is met on
    the calibration data or ``max_fraction`` of the quantizable layers (at least one) are promoted.

    max_fraction: in (0, 0.5] (``MIXED_PRECISION_FRACTION``). objective: cosine or SQNR of the worst float
    output against FP32 (an ``AccuracyTarget`` whose metric is in ``MIXED_PRECISION_METRICS``: the search
    measures on calibration samples, which have no labels for top-1; its ``max_float_layers`` is unused).
    """

    max_fraction: float = 0.05
    objective: AccuracyTarget = field(default_factory=lambda: AccuracyTarget("cosine", 0.99))

    def __post_init__(self) -> None:
        lo, hi = MIXED_PRECISION_FRACTION
        require_range("mixed_precision.max_fraction", self.max_fraction, lo, hi)
        if self.max_fraction <= lo:
            raise ValueError(f"mixed_precision.max_fraction must be > {lo}, got {self.max_fraction}")
        object.__setattr__(self, "max_fraction", float(self.max_fraction))
        if not isinstance(self.objective, AccuracyTarget):
            raise ValueError(f"mixed_precision.objective must be an AccuracyTarget, got {self.objective!r}")
        if self.objective.metric not in MIXED_PRECISION_METRICS:
            raise ValueError(
                f"mixed_precision.objective.metric must be one of {', '.join(MIXED_PRECISION_METRICS)} (it is "
                f"measured on calibration samples, which have no labels), got {self.objective.metric!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_fraction": self.max_fraction,
            "objective": {"metric": self.objective.metric, "threshold": self.objective.threshold},
        }
