"""Accuracy-target mode: keep the most harmful layers in float until the model meets the target.

Given the layer-wise ranking (``quantcore.analysis.ranking``: layers sorted by the output error each causes
when it alone is quantized, worst first), a *step* keeps the first n ranked layers in float (their node
names added, escaped, to ``exclude_node_patterns``), then annotates, calibrates, exports and evaluates
like the main run and measures the target metric (``AccuracyTarget``, on the deployed model, on exact
Q/DQ when ONNX Runtime could not build it). n is searched over the prefix lengths 1..N
(N = the number of ranked layers, at most ``max_float_layers``): doubling n (1, 2, 4, ...) until a step
meets the target, then bisecting between the last failing and the first meeting n, so a model with
L layers costs about 2·log2(L) steps. Bisection assumes that keeping more of the ranked layers in float
never hurts; when it does, the smallest n *seen* to meet the target is the one kept.

A step reuses the first run's scales where that is exact and observes only the tensors whose scale
would change (``quantcore.calibrate.reuse``). The ranking is computed once, on the fully quantized model.

Outcome: the model of the smallest n that meets the target, or, when none does, the best step's
model (best metric; ties to fewer float layers) with ``met`` false and a statement saying so. That
model is exported into ``out_dir``; every step is reported with its layers, metric, size and the
evaluation's per-sample latency.
"""

from __future__ import annotations

import glob
import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.annotate.annotation import Annotation, annotate
from quantcore.calibrate.reuse import recalibrate
from quantcore.config import AccuracyTarget, QuantizeConfig
from quantcore.errors import InvalidDataError
from quantcore.evaluate.evaluation import evaluate
from quantcore.export.qdq import ExportResult, export
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.runtime.batching import Batches
from quantcore.wording import counted

STAGE = "target"
VERDICT_NAMES = 10  # float layers named in the verdict (all of them are in the report)


def check_target(target: AccuracyTarget | None, labels: np.ndarray | None) -> None:
    """Raise ``InvalidDataError`` when the target cannot be measured on this data (top1_drop without labels)."""
    if target is not None and target.metric == "top1_drop" and labels is None:
        raise InvalidDataError("target metric top1_drop needs labels in the evaluation data")


def measured_mode(evaluation: Mapping[str, Any]) -> str:
    """The quantized mode the target is measured on: deployed, or exact Q/DQ when deployed was skipped."""
    return "qdq_exact" if evaluation["qdq_deployed"].get("skipped") else "qdq_deployed"


def measure(target: AccuracyTarget, evaluation: Mapping[str, Any]) -> float | None:
    """The target metric of an ``evaluate`` report (see ``quantcore.config``); None when it is
    undefined (non-finite outputs, missing top-1). A perfect match has SQNR +inf."""
    mode = evaluation[measured_mode(evaluation)]
    if target.metric == "top1_drop":
        fp32, quantized = evaluation["fp32"]["top1"], mode["top1"]
        return None if fp32 is None or quantized is None else 100.0 * (fp32 - quantized)
    values = []
    for metrics in mode["outputs"].values():
        if metrics.get("comparison") == "equality":
            continue  # integer, string...: derived from the float outputs the target is measured on
        if metrics["nonfinite"]:
            return None
        if target.metric == "cosine":
            values.append(metrics["cosine"])
        elif metrics["sqnr_db"] is not None:
            values.append(metrics["sqnr_db"])
        elif metrics["max_abs_error"] == 0.0:
            values.append(math.inf)
        else:
            values.append(None)
    return None if not values or None in values else min(values)


@dataclass(frozen=True)
class Candidate:
    """One configuration tried: its config, calibrated annotation, evaluation and measured metric."""

    float_layers: tuple[str, ...]
    config: QuantizeConfig
    annotation: Annotation
    evaluation: dict[str, Any]
    value: float | None
    met: bool


@dataclass(frozen=True)
class TargetOutcome:
    chosen: Candidate
    exported: ExportResult
    report: dict[str, Any]


@dataclass(frozen=True)
class TargetRun:
    """Everything a step needs, as the pipeline holds it after its first evaluation."""

    model_path: Path
    prepared: PreparedModel
    calibration: Batches
    evaluation: Mapping[str, np.ndarray]
    labels: np.ndarray | None
    out_dir: Path
    base: Annotation  # the first run's annotation before calibration
    base_calibrated: Annotation
    base_exported: ExportResult  # the first run's files in out_dir
    reference: onnx.ModelProto | None = None  # evaluate's, where not the model at model_path


def _step(run: TargetRun, config: QuantizeConfig, target: AccuracyTarget, layers: tuple[str, ...], monitor: Monitor):
    step_config = replace(
        config, exclude_node_patterns=(*config.exclude_node_patterns, *(glob.escape(n) for n in layers))
    )
    annotation = annotate(run.prepared, step_config)
    recalibrated = recalibrate(
        run.prepared,
        run.base,
        run.base_calibrated,
        annotation,
        run.calibration,
        step_config,
        should_cancel=monitor.should_cancel,
    )
    calibrated, reused = recalibrated.annotation, recalibrated.reused
    with tempfile.TemporaryDirectory(prefix="quantcore-target-") as scratch:
        exported = export(run.prepared, calibrated, scratch, platform=step_config.platform)
        evaluation = evaluate(
            run.model_path,
            exported.model_path,
            run.evaluation,
            step_config,
            labels=run.labels,
            should_cancel=monitor.should_cancel,
            reference=run.reference,
        )
    value = measure(target, evaluation)
    return Candidate(layers, step_config, calibrated, evaluation, value, target.met(value)), reused


def _better(target: AccuracyTarget, a: Candidate, b: Candidate) -> bool:
    """True when ``a`` is a better fallback than ``b``: a defined metric beats None, then the metric, then
    fewer float layers."""
    if a.value is None or b.value is None:
        return b.value is None and (a.value is not None or len(a.float_layers) < len(b.float_layers))
    if a.value != b.value:
        return a.value > b.value if target.higher_is_better else a.value < b.value
    return len(a.float_layers) < len(b.float_layers)


def reach_target(
    run: TargetRun,
    config: QuantizeConfig,
    first_evaluation: dict[str, Any],
    ranking: list[str],
    *,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
) -> TargetOutcome:
    """Search the float-layer prefix of ``ranking`` (node names, most harmful first) as the module says,
    starting from the first run (everything the rules allow quantized; ``first_evaluation`` its report).
    Precondition: ``config.target`` is set."""
    target = config.target
    if target is None:
        raise ValueError("reach_target needs config.target")
    value = measure(target, first_evaluation)
    first = Candidate((), config, run.base_calibrated, first_evaluation, value, target.met(value))
    monitor = Monitor(progress, should_cancel)
    limit = min(len(ranking), target.max_float_layers or len(ranking))
    steps: list[dict[str, Any]] = [_step_row(0, first, reused=None, seconds=0.0)]
    best, chosen = first, first if first.met else None
    failing, meeting = 0, None
    n = 1 if limit else 0

    def try_prefix(count: int) -> Candidate:
        monitor.check(STAGE)
        started = time.perf_counter()
        candidate, reused = _step(run, config, target, tuple(ranking[:count]), monitor)
        steps.append(_step_row(len(steps), candidate, reused=reused, seconds=time.perf_counter() - started))
        shown = "undefined" if candidate.value is None else f"{candidate.value:.4g}"
        monitor.report(
            STAGE,
            min(0.95, len(steps) / (2 * math.log2(limit + 1) + 2)),
            f"{count} layers in float: {target.metric} {shown}",
        )
        return candidate

    while chosen is None and 0 < n <= limit:
        candidate = try_prefix(n)
        best = candidate if _better(target, candidate, best) else best
        if candidate.met:
            chosen, meeting = candidate, n
        else:
            failing = n
            n = limit + 1 if n == limit else min(2 * n, limit)
    while meeting is not None and meeting - failing > 1:
        middle = (failing + meeting) // 2
        candidate = try_prefix(middle)
        if candidate.met:
            chosen, meeting = candidate, middle
        else:
            failing = middle

    met = chosen is not None
    kept = chosen if met else best
    exported = (
        run.base_exported
        if kept is first
        else export(run.prepared, kept.annotation, run.out_dir, platform=kept.config.platform)
    )
    kept_step = next(s["step"] for s in steps if tuple(s["float_layers"]) == kept.float_layers)
    value = "undefined" if kept.value is None else f"{kept.value:.6g}"
    named = ", ".join(kept.float_layers[:VERDICT_NAMES]) + (", ..." if len(kept.float_layers) > VERDICT_NAMES else "")
    layers = f"{counted(len(kept.float_layers), 'layer')} in float" + (f" ({named})" if kept.float_layers else "")
    if met:
        verdict = f"target {target.statement()} met: {target.metric} = {value} with {layers}"
    else:
        verdict = (
            f"target {target.statement()} NOT met after {len(steps)} step(s) (up to {limit} of {len(ranking)} ranked "
            f"layers in float); the best model found, kept as the job's artifacts, has {target.metric} = {value} "
            f"with {layers}"
        )
    report = {
        **target.to_dict(),
        "statement": target.statement(),
        "measured_on": measured_mode(first.evaluation),
        "met": met,
        "verdict": verdict,
        "chosen_step": kept_step,
        "float_layers": list(kept.float_layers),
        "ranked_layers": len(ranking),
        "search": "float-layer prefixes of the layer-wise ranking: doubling until met, then bisection",
        "steps": steps,
    }
    return TargetOutcome(kept, exported, report)


def _step_row(index: int, candidate: Candidate, *, reused: bool | None, seconds: float) -> dict[str, Any]:
    evaluation = candidate.evaluation
    mode = evaluation[measured_mode(evaluation)]
    return {
        "step": index,
        "float_layers": list(candidate.float_layers),
        "value": candidate.value,
        "met": candidate.met,
        "top1": mode["top1"],
        "qdq_bytes": evaluation["model"]["qdq_bytes"],
        "latency_ms_per_sample": evaluation["latency_ms_per_sample"].get(measured_mode(evaluation)),
        "calibration": None if reused is None else "reused" if reused else "recalibrated",
        "seconds": round(seconds, 3),
    }
