"""CPU deployment latency: ONNX Runtime (CPU EP, integer kernels as deployed) running the FP32 model
and the quantized model at batch 1 and batch 32.

Protocol per batch size: one session per model, the two models run interleaved (``interleaved_runs``): up to
``warmup`` untimed rounds (one at least: it also finds a batch size a model cannot run), then timed rounds in
which each model runs a block on the same inputs (wall clock, ``time.perf_counter``), the order rotated each
round, until each has ``runs`` runs. Interleaved, load from other processes falls on both models alike. Six
third-party models' preset files, at batch 1 and 32 (11 speed-ups), three reruns: timed one model's 50 runs
after the other's, a speed-up's reruns spread by a median 1.24x and up to 2.51x (ocr-cls at batch 32 read
1.43x, 1.18x and 0.57x); interleaved in blocks, alternated with those reruns, by a median 1.15x and up to
1.70x (ocr-cls at batch 32: 0.75x, 0.75x, 0.65x); on six other models (the bench's unseen group) by a median
1.17x and up to 1.30x, sequential 1.15x and 1.41x, and eeg-spindles read 2.2x at batch 1 interleaved, 1.75x
sequential, in every rerun. A block is ``BLOCK_RUNS`` runs of one model in a row, fewer once it has lasted
``BLOCK_S``: a run right after the other model's is slower, its caches taken, and short runs lose the most
(wakeword-embed's quantized model at batch 1: 0.85-0.88 ms alternated run by run, 0.68-0.69 ms in blocks of
five; FP32's 1.28-1.33 and 1.21-1.22 ms), while runs of 20 ms and more do not (ocr-cls at batch 32 read
0.72-0.74x in blocks of 1 to 30 runs) and alternate run by run. A time budget keeps large models from taking
minutes: the rounds stop once ``budget_s`` seconds have passed and each model has ``MIN_RUNS`` runs, the
warm-up once a fifth of it has (one round at least): a YOLOv8n (320x320, 0.4 s FP32 and 0.9 s quantized per
batch of 32 on 2 cores) took 72 s at 50 runs each. The runs each model got are in its summary.
Reported in ms: p50/p90/p99 (numpy linear-interpolated percentiles, so p50 ≤ p90 ≤ p99), mean, min, max;
throughput = batch · runs / Σ t (samples/s). Models whose every input fixes the batch dimension are measured at that
batch only; a dynamic batch axis gets each requested batch size.

Inputs: rows of ``sample`` (samples on each input's batch axis, ``quantcore.runtime.batching``, repeated
cyclically to fill a batch; constant inputs as given) when given, else synthetic (standard normal
floats, zero integers); symbolic non-batch dimensions need a sample.
The two models share threads settings and inputs; other load on the machine shows up in the numbers,
which is why p90/p99 are reported beside p50.

Every session measured has ONNX Runtime's intra-op spinning off (``SPIN_OFF``: its pool's threads sleep
between parallel sections instead of spinning). The measurements keep several sessions alive, and an idle
session's spinning threads take the cores from the one running: three sessions of one quantized magika
file, interleaved, read 1.5-2.4 ms at batch 1 and 70-75 ms at batch 32 with spinning, 1.54-1.62 and 49-50
ms without, where one session alone with spinning reads 1.2-1.8 and 49-52 ms. A session alone spins
to some gain at batch 1 (minilm's FP32 model 3.5 ms spinning, 4.2-4.6 ms not; 1.72x against 1.46x for its
quantized model), so the figures here are of a deployment with spinning off, as a server running several
sessions on its cores should be configured, and a lone session with spinning on runs at batch 1 faster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from quantcore.checks import require_seconds
from quantcore.errors import InvalidDataError
from quantcore.progress import Monitor
from quantcore.runtime.batching import InputSpec, input_specs
from quantcore.runtime.session import RUNTIME_ERRORS, SPIN_OFF, runtime_message

STAGE = "latency"
PERCENTILES = (50, 90, 99)
MIN_RUNS = 5  # timed runs a measurement gets before its budget can stop it (its median is then a real one)
BLOCK_RUNS = 5  # runs of one model in a row, at most, in interleaved rounds (see module)
BLOCK_S = 0.02  # a block ends once it has lasted this long: runs of 20 ms and more alternate one by one


@dataclass(frozen=True)
class LatencySettings:
    """warmup / runs: at most this many untimed rounds / timed runs of each model per batch size;
    budget_s: seconds of timed rounds after which a batch size's rounds stop once each model has ``MIN_RUNS``
    (None: always ``warmup`` and ``runs``); batch_sizes for dynamic-batch models; threads: ONNX Runtime
    intra-op threads (None: its default, one per physical core)."""

    warmup: int = 5
    runs: int = 50
    budget_s: float | None = 5.0
    batch_sizes: tuple[int, ...] = (1, 32)
    threads: int | None = None

    def __post_init__(self) -> None:
        for field in ("warmup", "runs"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if field == "warmup" else 1):
                raise ValueError(f"{field} must be an integer >= {0 if field == 'warmup' else 1}, got {value!r}")
        sizes = tuple(self.batch_sizes)
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
            raise ValueError(f"batch_sizes must be integers >= 1, got {self.batch_sizes!r}")
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(sizes))))
        require_seconds("budget_s", self.budget_s)
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(f"threads must be None or an integer >= 1, got {self.threads!r}")


def resolved_threads(threads: int | None) -> int:
    """``threads``, or all the cores this process may run on when None (``QuantizeConfig.cpu_threads``)."""
    if threads is not None:
        return threads
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def summarize(times_ms: Sequence[float], batch: int) -> dict[str, Any]:
    """Percentiles, mean/min/max (ms) and throughput (samples/s) of ``times_ms`` at ``batch``."""
    times = np.asarray(times_ms, dtype=np.float64)
    if times.size == 0:
        raise ValueError("no timings to summarize")
    p50, p90, p99 = (float(v) for v in np.percentile(times, PERCENTILES))
    total_s = float(times.sum()) / 1000.0
    return {
        "batch": int(batch),
        "runs": int(times.size),
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "mean_ms": float(times.mean()),
        "min_ms": float(times.min()),
        "max_ms": float(times.max()),
        "throughput_samples_per_s": batch * times.size / total_s if total_s > 0 else None,
    }


def interleaved_runs(
    calls: Sequence[Callable[[], object]],
    *,
    warmup: int,
    runs: int,
    min_runs: int,
    budget_s: float | None,
    warmup_s: float | None = None,
    enough: Callable[[list[list[float]]], bool] | None = None,
    extend: Callable[[list[list[float]]], bool] | None = None,
) -> list[list[float] | str]:
    """Each call's wall-clock ms over rounds in which every call runs a block (``BLOCK_RUNS`` runs in a row,
    fewer once the block has lasted ``BLOCK_S``; see module), the order rotated each round (none always runs
    first, and load from other processes falls on all alike), after ``warmup`` untimed rounds of one run each
    (fewer once ``warmup_s`` seconds have passed, one at least). A call stops at ``runs`` runs; the rounds stop
    when every call has; once every call has ``min_runs`` and ``budget_s`` seconds have passed (None: never),
    unless ``extend`` says to go on; or once ``enough`` says so. Both are asked of the times of the calls still
    running. A call that raises one of ONNX Runtime's errors in the warm-up gets its message in place of times and
    runs no more."""
    results: list[list[float] | str] = [[] for _ in calls]
    live = list(range(len(calls)))
    started = time.perf_counter()
    for _ in range(warmup):
        for i in list(live):
            try:
                calls[i]()
            except RUNTIME_ERRORS as error:
                results[i] = runtime_message(error)
                live.remove(i)
        if warmup_s is not None and time.perf_counter() - started >= warmup_s:
            break
    times: list[list[float]] = [results[i] for i in live]  # type: ignore[misc]
    started = time.perf_counter()
    for round_index in range(runs):
        shift = round_index % max(len(live), 1)
        for position in [*range(shift, len(live)), *range(shift)]:
            block_started = time.perf_counter()
            for _ in range(min(BLOCK_RUNS, runs - len(times[position]))):
                begun = time.perf_counter()
                calls[live[position]]()
                ended = time.perf_counter()
                times[position].append((ended - begun) * 1000.0)
                if ended - block_started >= BLOCK_S:
                    break
        done = min((len(t) for t in times), default=runs)
        spent = budget_s is not None and done >= min_runs and time.perf_counter() - started >= budget_s
        if done >= runs or (spent and not (extend is not None and extend(times))):
            break
        if enough is not None and enough(times):
            break
    return results


def fixed_batch(specs: Sequence[InputSpec]) -> int | None:
    """The batch every batched input fixes, if they all fix the same one (constant inputs have none)."""
    batches = {spec.fixed_batch for spec in specs if spec.batch_axis is not None}
    return batches.pop() if len(batches) == 1 and None not in batches else None


def feeds_for(
    specs: Sequence[InputSpec], batch: int, sample: Mapping[str, np.ndarray] | None = None, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """One batch of inputs: ``sample`` rows repeated cyclically, else synthetic values of the declared shape."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if sample is not None and spec.name in sample:
            rows = np.asarray(sample[spec.name])
            axis = spec.batch_axis
            if axis is None:  # a constant input (``quantcore.runtime.batching``): the same value in every batch
                feeds[spec.name] = np.array(rows, dtype=spec.dtype)
                continue
            if rows.ndim <= axis or rows.shape[axis] == 0:
                raise InvalidDataError(f"sample for input {spec.name!r} has no rows")
            picked = np.take(rows, np.arange(batch) % rows.shape[axis], axis=axis)
            feeds[spec.name] = np.ascontiguousarray(picked, dtype=spec.dtype)
            continue
        if spec.shape is None:
            raise InvalidDataError(f"input {spec.name!r} has no known shape; give sample inputs")
        shape = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim > 0:
                shape.append(dim)
            elif axis == spec.batch_axis:
                shape.append(batch)
            else:
                raise InvalidDataError(f"input {spec.name!r} axis {axis} is symbolic ({dim!r}); give sample inputs")
        if np.issubdtype(spec.dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return feeds


def latency_session(
    path: str | Path | bytes,
    threads: int | None,
    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    disabled_optimizers: Sequence[str] = (),
    *,
    profile_to: Path | None = None,
) -> ort.InferenceSession:
    """The session every CPU latency measurement runs in (this stage's and ``quantcore.analysis.placement``'s):
    errors-only logging, ``level`` (full optimization: the integer kernels as deployed), ``threads``
    intra-op threads (None: ONNX Runtime's default), intra-op spinning off (see module), the CPU EP,
    ``disabled_optimizers`` skipped. With ``profile_to`` (a directory), ONNX Runtime's profiler writes there
    (``profile_*.json``, on ``end_profiling``) and the optimized graph the profile's node names refer to
    (``optimized.onnx``)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    options.add_session_config_entry(*SPIN_OFF)
    if profile_to is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_to / "profile")
        options.optimized_model_filepath = str(profile_to / "optimized.onnx")
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(
        path if isinstance(path, bytes) else str(path),
        sess_options=options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=list(disabled_optimizers),
    )


def _deployed_session(
    path: str | Path, threads: int | None, notes: list[str], disabled_optimizers: Sequence[str]
) -> ort.InferenceSession:
    """The quantized model as the evaluate stage deploys it: full optimization (integer kernels) without
    ``disabled_optimizers`` (``quantcore.evaluate.parity``), or basic optimization where ONNX Runtime cannot build
    the fully optimized graph (float8 Q/DQ in some versions); the fallback is noted."""
    if disabled_optimizers:
        notes.append(f"quantized model measured with ONNX Runtime's {', '.join(disabled_optimizers)} disabled")
    try:
        return latency_session(path, threads, disabled_optimizers=disabled_optimizers)
    except Exception as error:  # ONNX Runtime raises its own exception types
        notes.append(
            f"ONNX Runtime's full optimization cannot build the quantized model ({str(error)[:200]}); "
            "measured at basic optimization, Q/DQ run as float ops"
        )
        return latency_session(path, threads, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, disabled_optimizers)


def cpu_latency(
    fp32_model: str | Path | onnx.ModelProto,
    quantized_model_path: str | Path,
    *,
    sample: Mapping[str, np.ndarray] | None = None,
    settings: LatencySettings | None = None,
    seed: int = 0,
    disabled_optimizers: Sequence[str] = (),
    monitor: Monitor | None = None,
) -> dict[str, Any]:
    """Plain-JSON latency of both models on ONNX Runtime's CPU EP::

        {"device": "cpu", "provider", "threads", "warmup", "runs", "budget_s", "batch_sizes": [1, 32],
         "fp32": {"batch_1": summary, "batch_32": summary}, "quantized": {...},
         "speedup_p50": {"batch_1": fp32 p50 / quantized p50, ...}, "notes": [...]}

    (a summary is ``summarize``'s dict). ``fp32_model``: a path, or the model itself where it is not the
    file as given (a half-precision model's float32 computation, ``quantcore.prepare.half_precision``).
    Fixed-batch models: ``batch_sizes`` is ``[their batch]``. A batch size the FP32 model does not run
    on is left out of ``batch_sizes``, with a note.
    ``disabled_optimizers``: ONNX Runtime rewrites the quantized model's session skips, as the deployed
    evaluation does (``QuantizeConfig.disabled_optimizers``). ``monitor``: progress of stage ``latency``
    after each measurement, and cancellation checked before each.
    """
    settings = settings or LatencySettings()
    monitor = monitor or Monitor()
    given = isinstance(fp32_model, onnx.ModelProto)
    specs = input_specs(fp32_model if given else onnx.load(str(fp32_model), load_external_data=False))
    notes = []
    batches = settings.batch_sizes
    fixed = fixed_batch(specs)
    if fixed is not None:
        batches = (fixed,)
        notes.append(f"the model fixes batch {fixed}; measured at that batch only")
    result: dict[str, Any] = {
        "device": "cpu",
        "provider": "CPUExecutionProvider",
        "onnxruntime": ort.__version__,
        "threads": settings.threads,
        "cpu_count": os.cpu_count(),
        "warmup": settings.warmup,
        "runs": settings.runs,
        "budget_s": settings.budget_s,
        "session_config": dict([SPIN_OFF]),
        "batch_sizes": list(batches),
        "fp32": {},
        "quantized": {},
        "speedup_p50": {},
        "notes": notes,
    }
    sessions = {
        "fp32": latency_session(fp32_model.SerializeToString() if given else fp32_model, settings.threads),
        "quantized": _deployed_session(quantized_model_path, settings.threads, notes, disabled_optimizers),
    }
    for i, batch in enumerate(batches):
        monitor.check(STAGE)
        feeds = feeds_for(specs, batch, sample, seed=seed)
        key = f"batch_{batch}"
        fp32, quantized = interleaved_runs(
            [lambda s=session, f=feeds: s.run(None, f) for session in sessions.values()],
            warmup=max(settings.warmup, 1),
            runs=settings.runs,
            min_runs=MIN_RUNS,
            budget_s=settings.budget_s,
            warmup_s=None if settings.budget_s is None else settings.budget_s / 5,
        )
        if isinstance(fp32, str):
            # the FP32 model itself does not run at this batch: its batch axis is time, convolved over
            # (madmom's onset CNN), say
            result["batch_sizes"].remove(batch)
            notes.append(f"not measured at batch {batch}: the FP32 model does not run on it ({fp32})")
            continue
        if isinstance(quantized, str):  # FP32 runs at this batch and the quantized model does not: a defect
            raise RuntimeError(f"the quantized model does not run at batch {batch}: {quantized}")
        result["fp32"][key], result["quantized"][key] = summarize(fp32, batch), summarize(quantized, batch)
        monitor.report(
            STAGE,
            (i + 1) / len(batches),
            f"batch {batch}: p50 FP32 {result['fp32'][key]['p50_ms']:.3g} ms, quantized "
            f"{result['quantized'][key]['p50_ms']:.3g} ms, {len(fp32)} and {len(quantized)} runs, interleaved",
        )
        if min(len(fp32), len(quantized)) < settings.runs:
            notes.append(
                f"batch {batch}: timed runs stopped at the {settings.budget_s:g} s budget "
                f"(FP32 {len(fp32)}, quantized {len(quantized)} runs)"
            )
        quantized_p50 = result["quantized"][key]["p50_ms"]
        result["speedup_p50"][key] = result["fp32"][key]["p50_ms"] / quantized_p50 if quantized_p50 > 0 else None
        if result["speedup_p50"][key] is not None and result["speedup_p50"][key] < 1.0:
            notes.append(f"at batch {batch} the quantized model is slower than FP32 on this CPU")
    return result
