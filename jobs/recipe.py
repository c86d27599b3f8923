"""The user-facing recipe: what a job should do, validated before anything is queued.

Unknown fields are refused (`extra="forbid"`) so a typo never silently does nothing; every bound
is stated on the field, so a validation error names the field and the allowed range. The worker
translates a `Recipe` into quantcore's own dataclasses in exactly one function
(`worker.translate.to_quantize_config`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CalibrationSpec(_Spec):
    observer: Literal["minmax", "percentile"] = Field(
        "percentile", description="How activation ranges are derived from the calibration data."
    )
    percentile: float = Field(
        99.99, ge=90.0, le=100.0, description="With observer=percentile: the |x| percentile taken as range."
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
    op_types: list[str] = Field(
        default_factory=list, max_length=256, description="ONNX op types to keep in float, e.g. ['Gemm']."
    )
    node_patterns: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Shell-style patterns over node names to keep in float, e.g. ['/head/*'].",
    )


class Recipe(_Spec):
    platform: Literal["tensorrt"] = Field(
        "tensorrt", description="Target runtime whose quantization rules the model follows."
    )
    precision: Literal["int8"] = Field("int8", description="Numeric format of quantized tensors.")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    exclude: ExcludeSpec = Field(default_factory=ExcludeSpec)
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds the calibration/evaluation split.")
