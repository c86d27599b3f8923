"""Mixed precision for sensitive tensors: the layers that quantization harms most leave the run's precision,
one more at a time, until the model meets an objective on the calibration data.

The layers are ranked as the analysis ranks them (``quantcore.analysis.ranking.analyze``: the model's outputs
with only layer k quantized against FP32, worst first), on the calibration samples, never the evaluation
data the report is judged by. A *step* promotes the first k ranked layers in the platform's form
(``quantcore.config.choices.MIXED_PRECISION_FORMS``):

    int16   the tensors layer k reads, activations and weights, go to 16 bits (``QuantizeConfig.wide_tensors``;
            an activation with the tensors sharing its scale, ``quantcore.annotate.widening``): a layer is
            harmed by either (an outlier channel of its input flattens the others' levels; a weight column
            scaled down to meet it rounds to zero per output channel), and the ranking measures both
            together. ONNX Runtime's CPU EP runs int16/uint16 QuantizeLinear/DequantizeLinear (opset 21)
            and the layer in float between them, as no integer kernel takes 16-bit inputs.
    float   layer k is kept float (its node name, escaped, added to ``exclude_node_patterns``): the exported
            graph computes it in float32, which ONNX Runtime's CPU simulation runs in FP32 and so does this
            project's strongly typed TensorRT build (``quantcore.tensorrt.build``: tensor types follow the
            graph; no FP16 flag), the float island a TensorRT engine then runs beside its INT8 layers.

Layers whose quantization changed no output are not candidates. k grows 1, 2, ... until the step meets
``MixedPrecisionConfig.objective``, or k reaches the cap: ``max_fraction`` of the quantizable layers (every
layer the ranking knows), at least one.

Scores are measured on calibration samples the steps were not calibrated on: the last ``SCORED_FRACTION``
of them (at most ``SEARCH_SAMPLES``) are held out, and the baseline (nothing promoted), the ranking and
every step are calibrated on the rest, so that a promotion that only fits the ranges of the samples it is
scored on does not win (where the data is too small to hold ``MIN_HELD_OUT`` samples out of both parts,
the first ``SEARCH_SAMPLES`` are scored, calibrated on too). Each step is annotated and calibrated (the
baseline's scales reused where that is exact, only the promoted tensors observed again), exported as exact Q/DQ
and scored against FP32: the worst float output's cosine or SQNR. The step kept is the first that meets
the objective, else the best scored (ties: fewer layers), which is no promotion at all when none beats the
baseline; it is then calibrated on every calibration sample, as the run's model is.

The model as quantized (every sample calibrated) is scored on the held-out samples first: when it meets the
objective, nothing is ranked or promoted.

Cost: one FP32 and one exact Q/DQ run of the scored samples; when the objective is not met, one calibration
of the baseline on the calibration part, the layer-wise ranking on it (bounded by ``config.analysis`` as the
analysis stage is), per step at most one calibration pass and one exact Q/DQ run of the scored samples, and
one calibration of the step kept on every sample.
"""

from __future__ import annotations

import glob
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from quantcore.analysis.ranking import analyze
from quantcore.annotate.annotation import Annotation, annotate
from quantcore.calibrate.calibration import calibrate
from quantcore.calibrate.reuse import recalibrate
from quantcore.config import AccuracyTarget, QuantizeConfig
from quantcore.config.choices import MIXED_PRECISION_FORMS
from quantcore.export.qdq import build_qdq_model
from quantcore.numerics.metrics import OutputAgreement
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session
from quantcore.wording import counted

STAGE = "mixed_precision"
SEARCH_SAMPLES = 64  # calibration samples each step is scored on, at most: a cosine or SQNR settles within them
SCORED_FRACTION = 0.25  # of the calibration samples, held out of the steps' calibration to score them on
MIN_HELD_OUT = 8  # samples in either part, or none is held out (one sample moves a cosine a lot)
RANKING_SHARE = 0.5  # of the stage's progress: the ranking, then the steps
FLOAT_FORM = "float32 (kept float: FP32 in ONNX Runtime and in the strongly typed TensorRT build)"


@dataclass(frozen=True)
class PromotionRun:
    """What the search starts from: the prepared model, its calibration batches, the first run's annotation
    (before and after calibration) and whether the ranking may use cones (``quantcore.runtime.memory_plan``)."""

    prepared: PreparedModel
    calibration: Batches
    annotation: Annotation
    calibrated: Annotation
    cones: bool = True


@dataclass(frozen=True)
class Promotion:
    """The step kept: its config (promotions in ``wide_tensors`` or ``exclude_node_patterns``), its
    annotation before and after calibration, and the report's ``mixed_precision`` section."""

    config: QuantizeConfig
    annotation: Annotation
    calibrated: Annotation
    report: dict[str, Any]


@dataclass(frozen=True)
class _Step:
    layers: tuple[dict[str, Any], ...]  # the ranking's rows promoted
    config: QuantizeConfig
    annotation: Annotation
    calibrated: Annotation
    value: float | None


def _promoted_config(config: QuantizeConfig, form: str, rows: tuple[dict[str, Any], ...]) -> QuantizeConfig:
    """``config`` with ``rows``' layers promoted in ``form`` (module docstring)."""
    if form == "float":
        return replace(
            config, exclude_node_patterns=(*config.exclude_node_patterns, *(glob.escape(r["node"]) for r in rows))
        )
    wide = dict.fromkeys((*config.wide_tensors, *(t for r in rows for t in r["tensors"])))
    return replace(config, wide_tensors=tuple(wide))


def _score(objective: AccuracyTarget, agreements: dict[str, OutputAgreement]) -> float | None:
    """The worst float output's cosine or SQNR (dB; +inf for a perfect match); None where an output is
    non-finite."""
    results = [a.result() for a in agreements.values() if a.elements]
    if not results or any(r["nonfinite"] for r in results):
        return None
    if objective.metric == "cosine":
        return min(r["cosine"] for r in results)
    return min(math.inf if r["sqnr_db"] is None else r["sqnr_db"] for r in results)


def _better(objective: AccuracyTarget, a: _Step, b: _Step) -> bool:
    """``a`` scores better than ``b`` (a defined value beats None; ties go to fewer layers)."""
    if a.value is None or b.value is None:
        return a.value is not None and b.value is None
    if a.value != b.value:
        return a.value > b.value if objective.higher_is_better else a.value < b.value
    return len(a.layers) < len(b.layers)


def promote(run: PromotionRun, config: QuantizeConfig, monitor: Monitor | None = None) -> Promotion:
    """Search the promotions as the module says. Precondition: ``config.mixed_precision`` is set and the
    platform has a form. Reports progress under ``STAGE``; raises ``Canceled`` between steps and batches."""
    options = config.mixed_precision
    if options is None:
        raise ValueError("promote needs config.mixed_precision")
    monitor = monitor or Monitor()
    objective, form = options.objective, MIXED_PRECISION_FORMS[config.platform]
    split = run.calibration.held_out(SCORED_FRACTION, SEARCH_SAMPLES, MIN_HELD_OUT)
    fit, samples = split if split is not None else (run.calibration, run.calibration.first(SEARCH_SAMPLES))
    outputs = [o.name for o in run.prepared.model.graph.output]
    with open_session(run.prepared.model, device=config.device) as session:
        reference = [session.run(outputs, batch) for batch in samples]

    def scored(calibrated: Annotation) -> float | None:
        agreements = {name: OutputAgreement(argmax=False) for name in outputs}
        with open_session(build_qdq_model(run.prepared, calibrated), device=config.device, exact_qdq=True) as session:
            for batch, expected in zip(samples, reference, strict=True):
                monitor.check(STAGE)
                for name, x, y in zip(outputs, expected, session.run(outputs, batch), strict=True):
                    agreements[name].update(x, y)
        return _score(objective, agreements)

    first = _Step((), config, run.annotation, run.calibrated, scored(run.calibrated))
    where = (
        f"the last {samples.num_samples} calibration samples, held out of the steps' calibration on the first "
        f"{fit.num_samples}"
        if split is not None
        else f"the first {samples.num_samples} calibration samples (too few to hold any out), calibrated on too"
    )
    report: dict[str, Any] = {
        "form": form,
        "max_fraction": options.max_fraction,
        "objective": {**options.to_dict()["objective"], "statement": objective.statement()},
        "measured_on": f"{where}; each model exported as exact Q/DQ and compared with FP32",
        "ranking_samples": None,
        "quantizable_layers": None,
        "cap": None,
        "candidates": None,
        "steps": [],
    }
    kept = first
    if not objective.met(first.value):  # the ranking costs more than the rest: only when something is to fix
        base = first
        if split is not None:  # the steps' baseline: calibrated on the same part as they are
            calibrated = calibrate(run.prepared, run.annotation, fit, config, should_cancel=monitor.should_cancel)
            base = _Step((), config, run.annotation, calibrated, scored(calibrated))
        report["steps"].append(_row(base, None if split is None else False, 0.0))
        search = replace(run, calibration=fit, calibrated=base.calibrated)
        kept = _search(search, config, form, objective, base, scored, report, monitor)
        if kept is base:
            kept = first
        elif split is not None:  # the exported model is calibrated on every sample, as the run's is
            kept = replace(kept, calibrated=_calibrated(run, kept.annotation, kept.config, monitor)[0])
    report.update(
        promoted=[_promoted_row(row, form, kept.calibrated) for row in kept.layers],
        before=first.value,
        after=kept.value,
        met=objective.met(kept.value),
        statement=_statement(objective, form, first, kept, report["cap"]),
    )
    return Promotion(kept.config, kept.annotation, kept.calibrated, report)


def _search(
    run: PromotionRun,
    config: QuantizeConfig,
    form: str,
    objective: AccuracyTarget,
    base: _Step,
    scored: Callable[[Annotation], float | None],
    report: dict[str, Any],
    monitor: Monitor,
) -> _Step:
    """Rank ``run``'s layers on its calibration data, then promote 1, 2, ... of them (module docstring),
    each step's row added to ``report``: the step kept (``base`` when none beats it)."""
    ranking_monitor = Monitor(
        lambda _stage, fraction, message: monitor.report(STAGE, RANKING_SHARE * fraction, f"ranking: {message}"),
        monitor.should_cancel,
    )
    analysis = analyze(
        run.prepared, run.calibrated, run.calibration.arrays, config, monitor=ranking_monitor, cones=run.cones
    )
    rows = [r for r in analysis["layers"] if r["analyzed"] and (r["nonfinite"] or r["sqnr_db"] is not None)]
    quantizable = analysis["layerwise"]["layers_total"]
    cap = max(1, math.floor(config.mixed_precision.max_fraction * quantizable))
    report.update(
        ranking_samples=analysis["layerwise"]["samples"], quantizable_layers=quantizable, cap=cap, candidates=len(rows)
    )
    kept = base
    for k in range(1, min(cap, len(rows)) + 1):
        monitor.check(STAGE)
        started = time.perf_counter()
        step_config = _promoted_config(config, form, tuple(rows[:k]))
        annotation = annotate(run.prepared, step_config)
        calibrated, reused = _calibrated(run, annotation, step_config, monitor)
        step = _Step(tuple(rows[:k]), step_config, annotation, calibrated, scored(calibrated))
        report["steps"].append(_row(step, reused, time.perf_counter() - started))
        shown = "undefined" if step.value is None else f"{step.value:.4g}"
        fraction = RANKING_SHARE + (1 - RANKING_SHARE) * k / min(cap, len(rows))
        monitor.report(STAGE, fraction, f"{counted(k, 'layer')} promoted: {objective.metric} {shown}")
        if objective.met(step.value):
            return step
        kept = step if _better(objective, step, kept) else kept
    return kept


def _calibrated(
    run: PromotionRun, annotation: Annotation, config: QuantizeConfig, monitor: Monitor
) -> tuple[Annotation, bool]:
    """(``annotation`` calibrated on ``run``'s calibration data, whether ``run.calibrated``'s scales covered
    every tensor): they are reused where exact, the promoted tensors observed again (``quantcore.calibrate.reuse``)."""
    done = recalibrate(
        run.prepared,
        run.annotation,
        run.calibrated,
        annotation,
        run.calibration,
        config,
        should_cancel=monitor.should_cancel,
    )
    return done.annotation, done.reused


def _row(step: _Step, reused: bool | None, seconds: float) -> dict[str, Any]:
    return {
        "promoted": len(step.layers),
        "layers": [row["node"] for row in step.layers],
        "value": step.value,
        "calibration": None if reused is None else "reused" if reused else "recalibrated",
        "seconds": round(seconds, 3),
    }


def _promoted_row(row: dict[str, Any], form: str, calibrated: Annotation) -> dict[str, Any]:
    """One promoted layer: its node, its rank's layer-wise SQNR and what it became (per tensor for int16)."""
    if form == "float":
        to = {t: FLOAT_FORM for t in row["tensors"]}
    else:
        to = {t: "uint16" if calibrated.configs[t].quant_min >= 0 else "int16" for t in row["tensors"]}
    return {"layer": row["node"], "op_type": row["op_type"], "layer_sqnr_db": row["sqnr_db"], "tensors": to}


def _statement(objective: AccuracyTarget, form: str, first: _Step, kept: _Step, cap: int | None) -> str:
    def shown(value: float | None) -> str:
        return "undefined" if value is None else f"{value:.6g}"

    head = f"mixed precision ({objective.statement()} on calibration samples)"
    if objective.met(first.value):
        return f"{head}: met as quantized ({objective.metric} {shown(first.value)}), nothing promoted"
    bound = "the cap" if cap is None else f"the cap of {counted(cap, 'layer')}"
    if not kept.layers:
        return f"{head}: no promotion within {bound} improved {objective.metric} {shown(first.value)}"
    names = ", ".join(row["node"] for row in kept.layers)
    met = "met" if objective.met(kept.value) else f"NOT met within {bound}"
    what = "at 16 bits" if form == "int16" else "kept float"
    return (
        f"{head}: {met}; {counted(len(kept.layers), 'layer')} {what} ({names}): {objective.metric} "
        f"{shown(first.value)} -> {shown(kept.value)}"
    )
