"""Latency-aware placement on the onnxruntime platform: quantized regions that do not pay for their
Q/DQ conversions on this CPU go back to float (``QuantizeConfig.cpu_objective == "latency"``).

After export, the calibrated annotation is split into regions (``quantcore.analysis.regions``). A
round times, for each move, the current model against the same model with the move's nodes
excluded (annotated again; calibration reused where exact, else calibrated on the first calibration
batch: a kernel's speed does not depend on its scales), at ``config.cpu_batch_sizes`` with
``config.cpu_threads`` (``quantcore.evaluate.paired_latency``: interleaved runs, quartiles). The moves
are each region, then each op class (``regions.op_classes``: every depthwise Conv, say): where the
quantized kernels lose only together, or a region pays for some of its op types and not others, no
single region's move is faster. A move goes float when float is clearly faster (beyond the spread, at
one batch size and slower at none); when in doubt it stays quantized. The winners of a round go float
together, and the next round measures the moves of the model that leaves, until a round moves none,
``MAX_ROUNDS`` rounds, or ``BUDGET_S`` seconds of timed runs (the moves not yet measured then stay
quantized). The budget counts each measurement's runs times their median, cached or not, so a rerun
from the cache stops where the first run stopped and measures nothing.

A region ONNX Runtime refuses to run quantized (the session fails with it, runs without it) goes
float with ONNX Runtime's message; a model it refuses to run either way is left as it is.

Last, FP32 (the prepared model), the fully quantized model and the placed one are timed together. Of
the two quantized ones the placed one is preferred only when clearly faster than the fully quantized
one; the preferred one is kept when it is no slower than FP32 (``paired_latency.no_slower``: clearly
slower at no batch size, and its median within ``MIN_GAIN`` of FP32's or below at every one, or clearly
faster at one), else the other one if it is, else FP32.
The objective promises a model never slower than FP32, so FP32 need not be clearly faster to win: under
load the spread of a run can swallow a 2x gap between medians. The kept configuration (the float nodes
added, escaped, to ``exclude_node_patterns``) is calibrated on the full calibration data (unless the
first calibration can be reused exactly, ``accuracy_target.reuse_calibration``) and exported into
``out_dir``; the evaluate stage then measures its accuracy as always.

Timings are read from and written to a ``TimingCache`` when the config names a directory
(``config.cpu_timing_cache``): a rerun of the same models on the same machine measures nothing.
"""

from __future__ import annotations

import functools
import glob
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from quantcore.analysis.accuracy_target import reuse_calibration
from quantcore.analysis.regions import count_op_types, op_classes, quantized_regions
from quantcore.annotate.annotation import Annotation, annotate
from quantcore.calibrate.calibration import calibrate
from quantcore.config import QuantizeConfig
from quantcore.evaluate.cpu_latency import fixed_batch, resolved_threads
from quantcore.evaluate.latency_cache import Measured, TimingCache, timing_key
from quantcore.evaluate.paired_latency import Timer, Timing, compare, interleaved_times, no_slower, signature
from quantcore.export.qdq import ExportResult, build_qdq_model, export
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.cpu_features import cpu_model

STAGE = "place"
MAX_ROUNDS = 3
BUDGET_S = 120.0  # seconds of timed runs (runs x p50) of the moves; the final comparison comes on top


@dataclass(frozen=True)
class PlacementRun:
    """What the search needs, as the pipeline holds it after export."""

    prepared: PreparedModel  # the model the annotation was made for (reconstruct's weights, if any)
    calibration: Batches
    sample: Mapping[str, np.ndarray] | None  # the first calibration batch: timing candidates calibrate on it
    base: Annotation  # the exported model's annotation, before calibration
    base_calibrated: Annotation
    base_exported: ExportResult
    out_dir: Path


@dataclass(frozen=True)
class PlacementOutcome:
    config: QuantizeConfig  # with the float regions excluded
    annotation: Annotation  # as annotated, before calibration
    calibrated: Annotation
    exported: ExportResult  # base_exported when nothing changed
    report: dict[str, Any]


@dataclass(frozen=True)
class _Variant:
    """One model timed: its float nodes, config, calibrated annotation and serialized QDQ model."""

    float_nodes: tuple[str, ...]
    config: QuantizeConfig
    annotation: Annotation
    calibrated: Annotation
    model: bytes


class _Search:
    """Mutable state of one placement: the variants built, the measurements made and read from cache."""

    def __init__(self, run: PlacementRun, config: QuantizeConfig, timer: Timer | None, monitor: Monitor) -> None:
        self.run, self.config, self.monitor = run, config, monitor
        self.threads = resolved_threads(config.cpu_threads)
        specs = input_specs(run.prepared.model)
        fixed = fixed_batch(specs)
        self.batch_sizes = (fixed,) if fixed is not None else tuple(config.cpu_batch_sizes)
        self.timer = timer or functools.partial(interleaved_times, specs=specs, sample=run.sample, threads=self.threads)
        self.cache = None if config.cpu_timing_cache is None else TimingCache(config.cpu_timing_cache)
        self.measured = self.cached = 0
        self.seconds = 0.0  # wall clock of the measurements made (the report's cost)
        self.spent = 0.0  # runs x p50 of every measurement, cached or not (the budget's)

    def variant(self, float_nodes: tuple[str, ...], *, full: bool = False) -> _Variant:
        """The model with ``float_nodes`` excluded; calibrated on the full data with ``full``, else on the
        first batch (timing only) unless the first calibration can be reused exactly."""
        run = self.run
        config = replace(
            self.config, exclude_node_patterns=(*self.config.exclude_node_patterns, *map(glob.escape, float_nodes))
        )
        annotation = annotate(run.prepared, config) if float_nodes else run.base
        calibrated = reuse_calibration(run.base, run.base_calibrated, annotation)
        if calibrated is None:
            data = run.calibration if full or run.sample is None else run.sample
            calibrated = calibrate(run.prepared, annotation, data, config, should_cancel=self.monitor.should_cancel)
        model = build_qdq_model(run.prepared, calibrated).SerializeToString()
        return _Variant(float_nodes, config, annotation, calibrated, model)

    def measure(self, models: Sequence[bytes]) -> tuple[Measured, bool]:
        """Per batch size, each model's ``Timing`` or refusal; and whether it came from the cache."""
        key = timing_key([signature(onnx.load_from_string(m)) for m in models], self.batch_sizes, self.threads)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            self.cached += 1
            self.spent += _timed_seconds(hit)
            return hit, True
        started = time.perf_counter()
        raw = self.timer(models, self.batch_sizes)
        self.seconds += time.perf_counter() - started
        self.measured += 1
        measured: Measured = {
            batch: [t if isinstance(t, str) else Timing.of(t) for t in times] for batch, times in raw.items()
        }
        if self.cache is not None:
            self.cache.put(key, measured)
        self.spent += _timed_seconds(measured)
        return measured, False


def _timed_seconds(measured: Measured) -> float:
    """Seconds of timed runs a measurement stands for: each timing's runs times its median."""
    return sum(t.runs * t.p50_ms / 1000.0 for models in measured.values() for t in models if isinstance(t, Timing))


def _timings(measured: Measured, index: int) -> dict[int, Timing]:
    return {b: models[index] for b, models in measured.items() if isinstance(models[index], Timing)}


def _refusal(measured: Measured, index: int) -> str | None:
    return next((m[index] for m in measured.values() if isinstance(m[index], str)), None)


def _row(
    round_index: int, move: str, nodes: tuple[str, ...], graph: Any, measured: Measured, cached: bool
) -> dict[str, Any]:
    return {
        "round": round_index,
        "move": move,
        "nodes": list(nodes),
        "op_types": count_op_types(graph, nodes),
        "timings": {
            f"batch_{b}": {
                label: t.to_dict() if isinstance(t, Timing) else None
                for label, t in zip(("quantized", "float"), models, strict=True)
            }
            for b, models in measured.items()
        },
        "cached": cached,
    }


def place(
    run: PlacementRun, config: QuantizeConfig, *, timer: Timer | None = None, monitor: Monitor | None = None
) -> PlacementOutcome:
    """Search and export the placement the module describes. ``timer``: measures models (a test passes a
    deterministic one; default ``paired_latency.interleaved_times``). Precondition: ``run.base_calibrated``
    is the calibration of ``run.base`` for ``config``, exported as ``run.base_exported``."""
    monitor = monitor or Monitor()
    search = _Search(run, config, timer, monitor)
    graph = run.prepared.model.graph
    model = build_qdq_model(run.prepared, run.base_calibrated).SerializeToString()  # the exported model
    base = current = _Variant((), config, run.base, run.base_calibrated, model)
    rows: list[dict[str, Any]] = []
    stopped, rounds = f"round limit ({MAX_ROUNDS})", 0
    for round_index in range(1, MAX_ROUNDS + 1):
        rounds = round_index
        regions = quantized_regions(graph, current.calibrated)
        region_moves = [("region", region.nodes) for region in regions]
        class_moves = [(f"op class {kind}", nodes) for kind, nodes in op_classes(graph, regions).items()]
        # op classes only once no region wins alone: a class holding a winning region would win through it
        moved = _try(search, round_index, region_moves, current, rows)
        if not moved and search.spent < BUDGET_S:
            moved = _try(search, round_index, class_moves, current, rows)
        if search.spent >= BUDGET_S:
            stopped = f"time budget ({BUDGET_S:g} s of timed runs): the moves not measured stay quantized"
        elif not moved:
            stopped = "no move changed the model"
        if not moved:
            break
        float_nodes = dict.fromkeys((*current.float_nodes, *(n for nodes in moved for n in nodes)))  # ordered set
        current = search.variant(tuple(float_nodes))
    return _choose(search, base, current, rows, rounds, stopped)


def _try(
    search: _Search,
    round_index: int,
    moves: Sequence[tuple[str, tuple[str, ...]]],
    current: _Variant,
    rows: list[dict[str, Any]],
) -> list[tuple[str, ...]]:
    """Time each of ``moves`` (name, nodes) against ``current`` until the budget is spent, append their rows,
    and return the nodes of those that go float."""
    graph = search.run.prepared.model.graph
    moved: list[tuple[str, ...]] = []
    for position, (move, nodes) in enumerate(moves):
        if search.spent >= BUDGET_S:
            break
        search.monitor.check(STAGE)
        trial = search.variant((*current.float_nodes, *nodes))
        measured, cached = search.measure([current.model, trial.model])
        row = _row(round_index, move, nodes, graph, measured, cached)
        refused, refused_float = _refusal(measured, 0), _refusal(measured, 1)
        if refused is not None and refused_float is None:
            row.update(kept="float", reason=f"ONNX Runtime refuses to run it quantized: {refused}")
            moved.append(nodes)
        elif refused is not None or refused_float is not None:
            row.update(kept="quantized", reason=f"not measured: {refused or refused_float}")
        elif compare(_timings(measured, 1), _timings(measured, 0)) == "faster":
            row.update(kept="float", reason="faster in float beyond the spread")
            moved.append(nodes)
        else:
            row.update(kept="quantized", reason="float is not clearly faster")
        rows.append(row)
        done = min(0.9, round_index / (MAX_ROUNDS + 1))
        search.monitor.report(STAGE, done, f"round {round_index}, {move} {position + 1}/{len(moves)}: {row['kept']}")
    return moved


def _choose(
    search: _Search, base: _Variant, placed: _Variant, rows: list[dict[str, Any]], rounds: int, stopped: str
) -> PlacementOutcome:
    """Time FP32, all quantized and placed together, keep the one the module's rule picks, and export it."""
    run, config = search.run, search.config
    every = tuple(n for r in quantized_regions(run.prepared.model.graph, base.calibrated) for n in r.nodes)
    fp32 = run.prepared.model.SerializeToString()
    labels = ("fp32", "quantized", "placed")
    measured, cached = search.measure([fp32, base.model, placed.model])
    timings = {label: _timings(measured, i) for i, label in enumerate(labels)}
    preferred = ["quantized", "placed"]
    if placed.float_nodes and compare(timings["placed"], timings["quantized"]) == "faster":
        preferred.reverse()
    if not placed.float_nodes:
        preferred.remove("placed")
    variants = {"quantized": base, "placed": placed}
    chosen = next((label for label in preferred if not every or no_slower(timings[label], timings["fp32"])), "fp32")
    kept = search.variant(every) if chosen == "fp32" else variants[chosen]
    if kept is not base:
        kept = search.variant(kept.float_nodes, full=True)
    exported = (
        run.base_exported
        if kept is base
        else export(run.prepared, kept.calibrated, run.out_dir, platform=config.platform)
    )
    final = {}
    for batch in measured:
        key = f"batch_{batch}"
        entry = {label: timings[label][batch].to_dict() if batch in timings[label] else None for label in labels}
        fp32_p50, kept_timing = entry["fp32"], timings[chosen].get(batch)
        speedup = None if fp32_p50 is None or kept_timing is None else fp32_p50["p50_ms"] / kept_timing.p50_ms
        final[key] = {**entry, "speedup_p50": speedup}
    float_moves = sum(1 for row in rows if row["kept"] == "float")
    report = {
        "objective": config.cpu_objective,
        "threads": search.threads,
        "batch_sizes": list(search.batch_sizes),
        "cpu": cpu_model(),
        "onnxruntime": ort.__version__,
        "rounds": rounds,
        "stopped": stopped,
        "regions": rows,
        "kept": chosen,
        "float_nodes": list(kept.float_nodes),
        "final": final,
        "final_cached": cached,
        "measurements": search.measured,
        "cached_measurements": search.cached,
        "measured_seconds": round(search.seconds, 3),
        "statement": _statement(chosen, float_moves, len(kept.float_nodes), final),
    }
    return PlacementOutcome(kept.config, kept.annotation, kept.calibrated, exported, report)


def _statement(chosen: str, float_moves: int, float_nodes: int, final: Mapping[str, Any]) -> str:
    speedups = ", ".join(
        f"{key.removeprefix('batch_')}: {v['speedup_p50']:.2f}x" for key, v in final.items() if v["speedup_p50"]
    )
    what = {
        "quantized": "every region stays quantized",
        "placed": f"{float_moves} move(s), {float_nodes} node(s), kept float for speed",
        "fp32": "every region kept float: no quantized model is as fast as FP32 on this CPU",
    }[chosen]
    return f"{what}; speed-up over FP32 (p50) at batch {speedups}" if speedups else what
