"""The one module that imports ``tensorrt`` (lazily, inside functions): parse, build, inspect, run.

Build (TensorRT 10.x and 11.x Python API)::

    builder = trt.Builder(logger)
    network = builder.create_network(1 << STRONGLY_TYPED)  # TensorRT 10; 11: always strongly typed, flag 0
    parser = trt.OnnxParser(network, logger); parser.parse_from_file(path)  # errors: parser.get_error(i)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(MemoryPoolType.WORKSPACE, workspace_bytes)
    config.builder_optimization_level = level          # 0..5, 3 is TensorRT's default
    config.profiling_verbosity = ProfilingVerbosity.DETAILED  # per-layer precisions for the inspector
    config.set_timing_cache(config.create_timing_cache(cached_bytes), ignore_mismatch=False)
    [config.set_flag(BuilderFlag.VERSION_COMPATIBLE)] [config.hardware_compatibility_level = ...]
    profile.set_shape(input, min, opt, max); config.add_optimization_profile(profile)  # dynamic inputs
    plan = builder.build_serialized_network(network, config)

Strongly typed: tensor types follow the QDQ graph (int8 where Q/DQ say so, float32 elsewhere); no
precision flags (FP16/INT8 BuilderFlags) and no INT8 calibrator, which TensorRT 10.1 deprecated and 11
removed. Parser errors and the builder's error log are returned verbatim in ``BuildFailed``.

Running: ``EngineRunner`` binds torch CUDA tensors by address (``set_tensor_address``), sets input
shapes and enqueues ``execute_async_v3`` on a stream of its own: on the legacy default stream TensorRT
adds ``cudaStreamSynchronize`` calls around ``enqueueV3`` (it warns so), which would inflate the
latency measured with CUDA events. The inspector's JSON
(``get_engine_information(LayerInformationFormat.JSON)``) is returned as text for
``quantcore.tensorrt.layer_precision``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from quantcore.errors import Canceled, QuantcoreError
from quantcore.progress import Monitor
from quantcore.tensorrt import timing_cache
from quantcore.tensorrt.profiles import OptimizationProfile

STAGE = "engine"
LOG_LIMIT = 200  # builder log lines kept for the report
HARDWARE_COMPATIBILITY = {"ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}


class BuildFailed(QuantcoreError):
    """TensorRT refused the model or the build; ``errors`` are its own messages, verbatim."""

    def __init__(self, message: str, errors: Sequence[dict[str, Any] | str] = ()) -> None:
        super().__init__(message)
        self.errors = list(errors)


def tensorrt_module() -> tuple[ModuleType | None, str | None]:
    """(the ``tensorrt`` module, None) or (None, why it cannot be imported)."""
    try:
        import tensorrt as trt
    except ImportError as error:  # not installed, or its CUDA libraries are missing
        return None, f"TensorRT is not importable: {error}"
    except OSError as error:
        return None, f"TensorRT cannot load its libraries: {error}"
    return trt, None


def _logger(trt: ModuleType) -> Any:
    class CollectingLogger(trt.ILogger):
        """Keeps warnings and errors (TensorRT's own words) for the report."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.WARNING) and len(self.messages) < LOG_LIMIT:
                self.messages.append(f"{severity.name}: {msg}")

    return CollectingLogger()


def _progress_monitor(trt: ModuleType, monitor: Monitor) -> Any:
    """A TensorRT ``IProgressMonitor`` that stops the build when the caller cancels (``step_complete``
    returning False makes ``build_serialized_network`` return None). TensorRT may call it from its own
    threads, so it only polls ``should_cancel`` (which must be thread-safe) and reports nothing."""

    class BuildProgress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.canceled = False

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            pass

        def step_complete(self, phase_name: str, step: int) -> bool:
            self.canceled = self.canceled or bool(monitor.should_cancel and monitor.should_cancel())
            return not self.canceled

        def phase_finish(self, phase_name: str) -> None:
            pass

    return BuildProgress()


def _parser_error(error: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"message": str(error)}
    for key in ("code", "desc", "node", "node_name", "node_operator", "file", "func", "line"):
        method = getattr(error, key, None)
        if callable(method):
            value = method()
            record[key] = value if isinstance(value, (int, str)) else str(value)
    return record


@dataclass(frozen=True)
class BuildSettings:
    """What the builder is told (validated by ``quantcore.tensorrt.engine.EngineOptions``)."""

    workspace_bytes: int
    optimization_level: int
    version_compatible: bool
    hardware_compatibility: str | None
    profiles: tuple[OptimizationProfile, ...]
    timing_cache_dir: Path | None


@dataclass(frozen=True)
class BuiltEngine:
    plan: bytes  # the serialized engine
    tensorrt_version: str
    strongly_typed: bool
    timing_cache: dict[str, Any]
    log: list[str] = field(default_factory=list)


def build_plan(
    trt: ModuleType, onnx_path: Path, settings: BuildSettings, *, gpu_name: str, monitor: Monitor | None = None
) -> BuiltEngine:
    """Parse ``onnx_path`` and build a serialized engine; raises ``BuildFailed`` with TensorRT's words,
    or ``Canceled`` when ``monitor.should_cancel`` turned True during the build."""
    monitor = monitor or Monitor()
    logger = _logger(trt)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0 if major >= 11 else 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # external data resolved relative to the file
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BuildFailed(f"the TensorRT ONNX parser rejected {onnx_path.name}", errors or logger.messages)

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    config.builder_optimization_level = settings.optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if settings.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if settings.hardware_compatibility is not None:
        level = getattr(trt.HardwareCompatibilityLevel, HARDWARE_COMPATIBILITY[settings.hardware_compatibility], None)
        if level is None:
            raise BuildFailed(
                f"TensorRT {trt.__version__} has no hardware compatibility level {settings.hardware_compatibility!r}"
            )
        config.hardware_compatibility_level = level
    for profile in settings.profiles:
        trt_profile = builder.create_optimization_profile()
        for name, shape in profile.shapes:
            trt_profile.set_shape(name, shape.min, shape.opt, shape.max)
        config.add_optimization_profile(trt_profile)

    cache_info: dict[str, Any] = {"path": None, "loaded_bytes": 0, "saved_bytes": 0}
    cache_file = None
    cached = None
    if settings.timing_cache_dir is not None:
        cache_file = timing_cache.cache_path(
            settings.timing_cache_dir, gpu_name=gpu_name, tensorrt_version=trt.__version__
        )
        cached = timing_cache.load(cache_file)
        cache_info.update(path=str(cache_file), loaded_bytes=len(cached or b""))
    cache = config.create_timing_cache(cached or b"")
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        cache_info["note"] = "the cache on disk did not match this device/version and was not used"
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)

    progress = None
    if hasattr(trt, "IProgressMonitor"):  # TensorRT >= 10.0
        progress = _progress_monitor(trt, monitor)
        config.progress_monitor = progress
    plan = builder.build_serialized_network(network, config)
    if plan is None and progress is not None and progress.canceled:
        raise Canceled(STAGE)
    if plan is None:
        raise BuildFailed("TensorRT could not build the engine", logger.messages)
    if cache_file is not None:
        new_cache = bytes(config.get_timing_cache().serialize())

        def combine(existing: bytes | None, new: bytes) -> bytes:
            if not existing:
                return new
            merged = config.create_timing_cache(existing)
            merged.combine(config.create_timing_cache(new), True)  # ignore_mismatch: keep what matches
            return bytes(merged.serialize())

        cache_info["saved_bytes"] = len(timing_cache.update(cache_file, new_cache, combine))
    return BuiltEngine(
        plan=bytes(plan),
        tensorrt_version=trt.__version__,
        strongly_typed=True,
        timing_cache=cache_info,
        log=list(logger.messages),
    )


def _torch_dtype(trt: ModuleType, dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=trt.nptype(dtype))).dtype


class EngineRunner:
    """One engine and execution context; inputs/outputs are torch CUDA tensors bound by address."""

    def __init__(
        self, trt: ModuleType, plan: bytes, *, profiles: Sequence[OptimizationProfile], host_code: bool
    ) -> None:
        self.trt = trt
        self.logger = _logger(trt)
        self.runtime = trt.Runtime(self.logger)
        self.runtime.engine_host_code_allowed = host_code  # version-compatible engines embed a lean runtime
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise BuildFailed("TensorRT could not deserialize the engine it built", self.logger.messages)
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()  # non-default: see the module docstring
        self.profiles = list(profiles)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.buffers: dict[str, torch.Tensor] = {}

    @contextmanager
    def on_stream(self) -> Iterator[None]:
        """torch work inside (copies, allocations, CUDA events) goes to the engine's stream."""
        with torch.cuda.stream(self.stream):
            yield

    def inspect(self) -> str:
        """The engine inspector's per-layer JSON."""
        inspector = self.engine.create_engine_inspector()
        inspector.execution_context = self.context
        return inspector.get_engine_information(self.trt.LayerInformationFormat.JSON)

    def _select_profile(self, feeds: Mapping[str, np.ndarray]) -> None:
        for index, profile in enumerate(self.profiles):
            if all(
                all(lo <= d <= hi for lo, d, hi in zip(shape.min, feeds[name].shape, shape.max, strict=False))
                for name, shape in profile.shapes
                if name in feeds
            ):
                if self.context.active_optimization_profile != index:
                    self.context.set_optimization_profile_async(index, self.stream.cuda_stream)
                return
        if self.profiles:
            shapes = {name: array.shape for name, array in feeds.items()}
            raise QuantcoreError(f"input shapes {shapes} fit no optimization profile of the engine")

    def bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Copy ``feeds`` to the device, set input shapes, allocate outputs, bind every address."""
        self._select_profile(feeds)
        with self.on_stream():
            for name in self.inputs:
                dtype = _torch_dtype(self.trt, self.engine.get_tensor_dtype(name))
                tensor = torch.from_numpy(np.ascontiguousarray(feeds[name])).to(device="cuda", dtype=dtype)
                self.buffers[name] = tensor
                self.context.set_input_shape(name, tuple(tensor.shape))
                self.context.set_tensor_address(name, tensor.data_ptr())
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                dtype = _torch_dtype(self.trt, self.engine.get_tensor_dtype(name))
                self.buffers[name] = torch.empty(shape, dtype=dtype, device="cuda")
                self.context.set_tensor_address(name, self.buffers[name].data_ptr())

    def launch(self) -> None:
        """Enqueue one inference on the engine's stream (buffers already bound)."""
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise QuantcoreError("TensorRT execute_async_v3 failed: " + "; ".join(self.logger.messages[-5:]))

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.bind(feeds)
        self.launch()
        self.stream.synchronize()
        with self.on_stream():
            return {name: self.buffers[name].float().cpu().numpy() for name in self.outputs}
