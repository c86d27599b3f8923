"""The recipe's ``deploy`` section: what the job measures and builds for the runtime the model will run on
(the CPU latency stage, the TensorRT engine, the CPU placement's objective, threads, batch sizes and timing
budget). ``jobs.recipe`` checks how it combines with the platform."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from jobs.recipe_methods import Spec


class DeploySpec(Spec):
    cpu_latency: bool = Field(
        True,
        title="CPU latency",
        description="Measure FP32 vs quantized latency on ONNX Runtime's CPU EP at batch 1 and 32.",
    )
    tensorrt_engine: bool = Field(
        True,
        title="TensorRT engine",
        description="Build a TensorRT engine from the QDQ model (tensorrt platforms only). On a worker without "
        "CUDA and TensorRT the stage ends 'skipped' with the reason in the report.",
    )
    cpu_objective: Literal["latency", "accuracy", "size"] | None = Field(
        None,
        title="CPU objective",
        description="Platform onnxruntime: latency = quantized regions that run slower than float on the worker's "
        "CPU (timed at batch_sizes with cpu_threads) are kept float, so the model is never slower than FP32, and "
        "strategy auto keeps a clearly faster candidate that meets its objective over a more accurate one; "
        "accuracy = every region the rules quantize stays quantized, no timing; size = the same, for the smallest "
        "model. Left out: latency on platform onnxruntime, accuracy elsewhere (latency needs onnxruntime).",
    )
    cpu_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        title="CPU threads",
        description="ONNX Runtime intra-op threads for the placement and the CPU latency measurements; null: all "
        "the worker's cores.",
    )
    batch_sizes: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1, 32],
        min_length=1,
        max_length=8,
        description="Batch sizes the placement and the CPU latency are measured at.",
    )
    timing_share: float = Field(
        1.0,
        ge=0.1,
        le=100.0,
        title="Placement timing budget",
        description="The placement's timing runs, as a multiple of the job's calibration time. A model "
        "whose first profile takes the whole budget keeps FP32 or the fully quantized model rather than a placement "
        "it could not check; a larger share buys more rounds.",
    )
