"""Options of the layer-wise analysis (``AnalysisOptions``) and of the accuracy-target mode (``AccuracyTarget``).

Target metrics (``TARGET_METRICS``), each measured on the evaluation data, on the exported model as
deployed on ONNX Runtime (exact Q/DQ when the deployed session could not be built):

    top1_drop   FP32 top-1 minus quantized top-1, in percentage points; met when <= threshold (labels needed)
    cosine      the lowest output cosine to FP32;                        met when >= threshold
    sqnr        the lowest output SQNR (dB) to FP32;                     met when >= threshold
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quantcore.checks import require_bool, require_choice, require_int, require_seconds

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
    layers (chosen as by ``max_layers``); and on the clock as they run: a run that would end past it is
    not started (the first reference and layer runs always are), the most harmful layers measured first.
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
