"""Stage 7, build engine: a TensorRT engine from the QDQ ONNX, checked and measured, or an honest skip.

    specs = input_specs("model.onnx")  # quantcore.runtime.batching: each input's batch axis
    result = build_engine("out/model.qdq.onnx", "out/", fp32_model_path="model.onnx",
                          evaluation={"input": x}, calibration_shapes=observed_shapes(calib, 16, specs),
                          timing_cache_dir="var/trt-cache")
    result.status  # "built" | "skipped" | "failed"; result.reason says why when not built

Design, one module per concept:

- ``qdq_rules``: static checks of TensorRT's explicit-quantization rules (Q→DQ pairs, symmetric zero
  offsets, positive finite constant scales, per-tensor activations, output-channel axis of per-channel
  weights, INT4 weight-only, Q/DQ that cannot be fused). Pure ONNX, run everywhere, before any build;
  their findings go into the result whatever its status.
- ``profiles``: the (min, opt, max) optimization profile of every dynamic input, from the recipe or
  derived from the shapes the calibration data was fed at.
- ``timing_cache``: one TensorRT timing cache per (GPU model, TensorRT version), shared across jobs
  under an ``fcntl`` file lock, merged with ``ITimingCache.combine``.
- ``tensorrt_build``: the only module importing ``tensorrt`` (lazily): strongly typed network, ONNX
  parser errors verbatim, workspace limit, builder optimization level, profiles, timing cache,
  version/hardware compatibility; ``EngineRunner`` executes an engine on torch CUDA buffers.
- ``layer_precision``: per-layer precision from the engine inspector, and which INT8-annotated layers
  TensorRT ran in higher precision.
- ``comparison``: engine outputs against ONNX Runtime running the QDQ model (exact Q/DQ) and FP32.
- ``gpu_latency`` (CUDA events) and ``latency`` (ONNX Runtime CPU, FP32 vs quantized at batch 1 and 32;
  usable without any GPU, for users who deploy on CPU): p50/p90/p99 ms and throughput.
- ``fp16_model``: the FP32 model rewritten to float16 so a strongly typed build of it is the FP16
  baseline the INT8 engine's speed-up is measured against.
- ``metadata``: CUDA availability, GPU facts, ONNX SHA-256 stored beside the engine.

Files written in ``out_dir`` (atomically) when built: ``model.engine`` and ``engine.json`` (the
result's ``to_dict()``: metadata, layers, comparison, latency). Without CUDA or TensorRT the stage
returns ``skipped`` with the reason and writes nothing: no number in the result is ever made up.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx.external_data_helper import load_external_data_for_model

from quantcore import atomic
from quantcore.errors import Canceled, InvalidDataError, QuantcoreError
from quantcore.evaluate.cpu_latency import LatencySettings, cpu_latency, feeds_for, fixed_batch
from quantcore.jsonable import jsonable
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.runtime.batching import InputSpec, input_specs
from quantcore.tensorrt.build import BuildFailed, BuildSettings, EngineRunner, build_plan, tensorrt_module
from quantcore.tensorrt.comparison import compare_with_references
from quantcore.tensorrt.fp16_model import to_float16
from quantcore.tensorrt.gpu_latency import gpu_latency
from quantcore.tensorrt.layer_precision import int8_annotated_nodes, layer_table
from quantcore.tensorrt.metadata import cuda_status, external_data_files, file_sha256, gpu_info
from quantcore.tensorrt.profiles import OptimizationProfile, ShapeRange, observed_shapes, profiles_for
from quantcore.tensorrt.qdq_rules import Finding, check_qdq, summarize

STAGE = "engine"
STATUSES = ("built", "skipped", "failed")
ENGINE_FILE = "model.engine"
METADATA_FILE = "engine.json"
METADATA_FORMAT = "quantcore.engine/1"
DEFAULT_WORKSPACE_BYTES = 4 << 30  # 4 GiB of scratch memory for tactics
HARDWARE_LEVELS = ("ampere_plus", "same_compute_capability")

__all__ = [
    "ENGINE_FILE",
    "METADATA_FILE",
    "EngineOptions",
    "EngineResult",
    "Finding",
    "LatencySettings",
    "OptimizationProfile",
    "ShapeRange",
    "build_engine",
    "check_qdq",
    "cpu_latency",
    "observed_shapes",
    "profiles_for",
]


@dataclass(frozen=True)
class EngineOptions:
    """Builder options. optimization_level: TensorRT's 0..5 (3 default; higher searches longer).
    hardware_compatibility: None, "ampere_plus" or "same_compute_capability". batch_sizes: the batch
    sizes the engine serves; derived profiles cover them and latency is measured at the smallest and
    largest the engine accepts. latency_warmup / latency_runs: per measurement."""

    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES
    optimization_level: int = 3
    version_compatible: bool = False
    hardware_compatibility: str | None = None
    timing_cache_dir: Path | None = None
    batch_sizes: tuple[int, ...] = (1, 32)
    latency_warmup: int = 20
    latency_runs: int = 200

    def __post_init__(self) -> None:
        if (
            isinstance(self.workspace_bytes, bool)
            or not isinstance(self.workspace_bytes, int)
            or self.workspace_bytes < 1
        ):
            raise ValueError(f"workspace_bytes must be a positive integer, got {self.workspace_bytes!r}")
        if isinstance(self.optimization_level, bool) or self.optimization_level not in range(6):
            raise ValueError(f"optimization_level must be an integer in 0..5, got {self.optimization_level!r}")
        if not isinstance(self.version_compatible, bool):
            raise ValueError(f"version_compatible must be a bool, got {self.version_compatible!r}")
        if self.hardware_compatibility is not None and self.hardware_compatibility not in HARDWARE_LEVELS:
            raise ValueError(
                f"hardware_compatibility must be None or one of {HARDWARE_LEVELS}, got {self.hardware_compatibility!r}"
            )
        if self.timing_cache_dir is not None:
            object.__setattr__(self, "timing_cache_dir", Path(self.timing_cache_dir))
        LatencySettings(warmup=self.latency_warmup, runs=self.latency_runs, batch_sizes=self.batch_sizes)  # validates
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))

    def to_dict(self) -> dict[str, Any]:
        return {
            "strongly_typed": True,
            "precision_flags": [],
            "workspace_bytes": self.workspace_bytes,
            "optimization_level": self.optimization_level,
            "version_compatible": self.version_compatible,
            "hardware_compatibility": self.hardware_compatibility,
            "timing_cache_dir": None if self.timing_cache_dir is None else str(self.timing_cache_dir),
            "batch_sizes": list(self.batch_sizes),
        }


@dataclass(frozen=True)
class EngineResult:
    """The stage's outcome. ``reason`` is set exactly when status is not "built"."""

    status: str
    reason: str | None
    engine_path: Path | None = None
    metadata_path: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    qdq_checks: dict[str, Any] = field(default_factory=dict)
    layers: tuple[dict[str, Any], ...] = ()
    precision_notes: tuple[str, ...] = ()
    comparison: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    errors: tuple[Any, ...] = ()  # TensorRT's own messages when it failed
    log: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if (self.status == "built") == bool(self.reason):
            raise ValueError("reason is required for skipped/failed and absent for built")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineResult:
        """The inverse of ``to_dict`` (a result written by a build that ran in another process)."""
        engine_path = None if data.get("engine_path") is None else Path(data["engine_path"])
        return cls(
            status=data["status"],
            reason=data.get("reason"),
            engine_path=engine_path,
            metadata_path=None if engine_path is None else engine_path.parent / METADATA_FILE,
            metadata=dict(data.get("metadata") or {}),
            qdq_checks=dict(data.get("qdq_checks") or {}),
            layers=tuple(data.get("layers") or ()),
            precision_notes=tuple(data.get("precision_notes") or ()),
            comparison=data.get("comparison"),
            latency=data.get("latency"),
            errors=tuple(data.get("errors") or ()),
            log=tuple(data.get("log") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "status": self.status,
                "reason": self.reason,
                "engine_path": self.engine_path,
                "metadata": self.metadata,
                "qdq_checks": self.qdq_checks,
                "layers": list(self.layers),
                "precision_notes": list(self.precision_notes),
                "comparison": self.comparison,
                "latency": self.latency,
                "errors": list(self.errors),
                "log": list(self.log),
            }
        )


def _latency_batches(
    specs: Sequence[InputSpec], profiles: Sequence[OptimizationProfile], wanted: Sequence[int]
) -> list[int]:
    """Smallest and largest of ``wanted`` the engine accepts along every input's batch axis (fixed-batch
    models: their batch)."""
    fixed = fixed_batch(specs)
    if fixed is not None:
        return [fixed]
    if not profiles:
        return sorted({min(wanted), max(wanted)})
    first = profiles[0]
    axes = {spec.name: spec.batch_axis for spec in specs}
    batched = [(shape, axes[name]) for name, shape in first.shapes if axes.get(name) is not None]
    if not batched:
        return sorted({min(wanted), max(wanted)})
    low = max(shape.min[axis] for shape, axis in batched)
    high = min(shape.max[axis] for shape, axis in batched)
    inside = [b for b in wanted if low <= b <= high] or [low, high]
    return sorted({min(inside), max(inside)})


def _specs_at(specs: list[InputSpec], profiles: Sequence[OptimizationProfile]) -> list[InputSpec]:
    """``specs`` with symbolic non-batch dimensions set to the first profile's opt shape."""
    if not profiles:
        return specs
    profile, pinned = profiles[0], []
    for spec in specs:
        if spec.shape is not None and spec.name in profile.names:
            opt = profile[spec.name].opt
            shape = tuple(
                d if axis == spec.batch_axis or (isinstance(d, int) and d > 0) else opt[axis]
                for axis, d in enumerate(spec.shape)
            )
            spec = replace(spec, shape=shape)
        pinned.append(spec)
    return pinned


def _measure(runner: Any, specs: Any, batches: Sequence[int], sample: Any, options: EngineOptions) -> dict[str, Any]:
    """CUDA-event latency at each batch; inputs from ``sample`` rows, else synthetic at the profile's opt."""
    measured = {}
    for batch in batches:
        runner.bind(feeds_for(specs, batch, sample))
        with runner.on_stream():  # CUDA events on the stream the engine is enqueued on
            measured[f"batch_{batch}"] = gpu_latency(
                runner.launch, batch, warmup=options.latency_warmup, runs=options.latency_runs
            )
    return measured


def build_engine(
    qdq_model_path: str | Path,
    out_dir: str | Path,
    *,
    profiles: Sequence[OptimizationProfile] | None = None,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
    optimization_level: int = 3,
    timing_cache_dir: str | Path | None = None,
    version_compatible: bool = False,
    hardware_compatibility: str | None = None,
    calibration_shapes: Mapping[str, Sequence[Sequence[int]]] | None = None,
    fp32_model_path: str | Path | None = None,
    evaluation: Mapping[str, np.ndarray] | None = None,
    batch_sizes: Sequence[int] = (1, 32),
    latency_warmup: int = 20,
    latency_runs: int = 200,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
    skip_reason: str | None = None,
) -> EngineResult:
    """Check, build, inspect, compare and time a TensorRT engine of the QDQ model at ``qdq_model_path``.

    profiles: the recipe's optimization profiles; else derived from ``calibration_shapes``
    (``observed_shapes(calibration, batch_size, specs)``), widened to ``batch_sizes``. fp32_model_path:
    the original model, for the FP32 comparison and the FP16 baseline engine. evaluation: inputs (samples
    along each input's batch axis) for the output comparison and as latency inputs. Raises ``ValueError``
    on bad options and ``Canceled``; everything TensorRT or CUDA refuses ends as status "failed" with the reason.
    ``should_cancel`` is also polled during the TensorRT build, from TensorRT's threads: it must be
    thread-safe (a flag or a fresh DB read, not a shared session). skip_reason: the caller knows no
    engine can be built for this run (a service with no GPU worker, say): the static checks and
    profiles are still produced, then the result is "skipped" with this reason and nothing is built.
    """
    options = EngineOptions(
        workspace_bytes=workspace_bytes,
        optimization_level=optimization_level,
        version_compatible=version_compatible,
        hardware_compatibility=hardware_compatibility,
        timing_cache_dir=None if timing_cache_dir is None else Path(timing_cache_dir),
        batch_sizes=tuple(batch_sizes),
        latency_warmup=latency_warmup,
        latency_runs=latency_runs,
    )
    monitor = Monitor(progress, should_cancel)
    monitor.check(STAGE)
    monitor.report(STAGE, 0.0, "checking TensorRT's Q/DQ rules")
    qdq_path, out_dir = Path(qdq_model_path), Path(out_dir)
    model = onnx.load(str(qdq_path), load_external_data=False)
    locations = [
        entry.value
        for tensor in model.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    ]
    if locations:  # beyond 2 GB: weights live beside the model
        load_external_data_for_model(model, str(qdq_path.parent))
    checks = summarize(check_qdq(model))
    metadata: dict[str, Any] = {
        "format": METADATA_FORMAT,
        "onnx_file": qdq_path.name,
        "onnx_sha256": file_sha256(qdq_path),
        "onnx_external_data": external_data_files(qdq_path, locations),
        "flags": options.to_dict(),
    }
    profile_error = None
    try:
        chosen = profiles_for(
            model, explicit=profiles, calibration_shapes=calibration_shapes, batch_sizes=options.batch_sizes
        )
        metadata["profiles"] = [p.to_dict() for p in chosen]
    except InvalidDataError as error:
        chosen, profile_error = (), str(error)
        metadata.update(profiles=None, profile_error=profile_error)

    if skip_reason:
        monitor.report(STAGE, 1.0, f"skipped: {skip_reason}")
        return EngineResult(status="skipped", reason=skip_reason, metadata=metadata, qdq_checks=checks)
    usable, cuda_reason = cuda_status()
    trt, trt_reason = tensorrt_module()
    if trt is not None:
        metadata["tensorrt_version"] = trt.__version__
    missing = [reason for reason in (cuda_reason, trt_reason) if reason]
    if missing:
        reason = "; ".join(missing)
        monitor.report(STAGE, 1.0, f"skipped: {reason}")
        return EngineResult(status="skipped", reason=reason, metadata=metadata, qdq_checks=checks)
    assert usable and trt is not None
    if profile_error is not None:
        return EngineResult(status="failed", reason=profile_error, metadata=metadata, qdq_checks=checks)
    try:
        return _build_and_measure(
            trt, model, qdq_path, out_dir, chosen, options, metadata, checks, fp32_model_path, evaluation, monitor
        )
    except Canceled:
        raise
    except QuantcoreError as error:  # BuildFailed included (TensorRT's words in .errors)
        errors = tuple(getattr(error, "errors", ()))
        return EngineResult(status="failed", reason=str(error), metadata=metadata, qdq_checks=checks, errors=errors)
    except (RuntimeError, OSError) as error:  # CUDA out of memory, driver errors
        return EngineResult(
            status="failed", reason=f"{type(error).__name__}: {error}", metadata=metadata, qdq_checks=checks
        )


def _build_and_measure(
    trt: Any,
    model: onnx.ModelProto,
    qdq_path: Path,
    out_dir: Path,
    chosen: tuple[OptimizationProfile, ...],
    options: EngineOptions,
    metadata: dict[str, Any],
    checks: dict[str, Any],
    fp32_model_path: str | Path | None,
    evaluation: Mapping[str, np.ndarray] | None,
    monitor: Monitor,
) -> EngineResult:
    gpu = gpu_info()
    metadata.update(gpu=gpu, host=socket.gethostname())
    settings = BuildSettings(
        workspace_bytes=options.workspace_bytes,
        optimization_level=options.optimization_level,
        version_compatible=options.version_compatible,
        hardware_compatibility=options.hardware_compatibility,
        profiles=chosen,
        timing_cache_dir=options.timing_cache_dir,
    )
    monitor.report(STAGE, 0.1, f"building the INT8 engine on {gpu['name']}")
    built = build_plan(trt, qdq_path, settings, gpu_name=gpu["name"], monitor=monitor)
    metadata.update(
        tensorrt_version=built.tensorrt_version, timing_cache=built.timing_cache, engine_bytes=len(built.plan)
    )
    engine_path = out_dir / ENGINE_FILE
    atomic.write_bytes(engine_path, built.plan)
    monitor.check(STAGE)

    runner = EngineRunner(trt, built.plan, profiles=chosen, host_code=options.version_compatible)
    layers, notes = layer_table(runner.inspect(), int8_annotated_nodes(model))
    model_specs = input_specs(model)
    specs = _specs_at(model_specs, chosen)
    batches = _latency_batches(model_specs, chosen, options.batch_sizes)
    comparison = None
    if evaluation:
        monitor.report(STAGE, 0.4, "comparing engine outputs with ONNX Runtime")
        references: dict[str, tuple[str | Path, bool]] = {"qdq": (qdq_path, True)}
        if fp32_model_path is not None:
            references["fp32"] = (fp32_model_path, False)
        comparison = compare_with_references(runner.run, references, evaluation, batches[-1], model_specs)
    monitor.check(STAGE)
    monitor.report(STAGE, 0.6, "measuring engine latency")
    latency: dict[str, Any] = {
        "timer": "cuda-events",
        "batches": batches,
        "int8": _measure(runner, specs, batches, evaluation, options),
    }
    del runner
    if fp32_model_path is not None:
        monitor.check(STAGE)
        monitor.report(STAGE, 0.8, "building the FP16 baseline engine")
        half = to_float16(onnx.load(str(fp32_model_path)))
        try:
            with tempfile.TemporaryDirectory(dir=out_dir, prefix=".fp16-") as scratch:
                half_path = Path(scratch) / "model.fp16.onnx"
                atomic.save_model(half.model, half_path)
                half_built = build_plan(trt, half_path, settings, gpu_name=gpu["name"], monitor=monitor)
            half_runner = EngineRunner(trt, half_built.plan, profiles=chosen, host_code=options.version_compatible)
            latency["fp16"] = _measure(half_runner, specs, batches, evaluation, options)
            latency["fp16_saturated_weights"] = half.saturated
            del half_runner
        except BuildFailed as error:
            latency["fp16"] = {"status": "failed", "reason": str(error), "errors": error.errors}
        speedups = {}
        for key, int8 in latency["int8"].items():
            fp16 = latency["fp16"].get(key) if "status" not in latency["fp16"] else None
            if fp16:
                speedups[key] = fp16["p50_ms"] / int8["p50_ms"] if int8["p50_ms"] > 0 else None
                if speedups[key] is not None and speedups[key] <= 1.0:
                    notes.append(
                        f"at {key.replace('_', ' ')} the INT8 engine is not faster than FP16 ({speedups[key]:.2f}x)"
                    )
        latency["speedup_p50_vs_fp16"] = speedups
    result = EngineResult(
        status="built",
        reason=None,
        engine_path=engine_path,
        metadata_path=out_dir / METADATA_FILE,
        metadata=metadata,
        qdq_checks=checks,
        layers=tuple(layers),
        precision_notes=tuple(notes),
        comparison=comparison,
        latency=latency,
        log=tuple(built.log),
    )
    atomic.write_json(out_dir / METADATA_FILE, result.to_dict())
    monitor.report(STAGE, 1.0, f"built {engine_path.name} ({len(built.plan)} bytes)")
    return result
