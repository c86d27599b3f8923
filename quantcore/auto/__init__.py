"""``strategy="auto"``: search variations of the user's config, then quantize once with the one chosen.

    auto (candidates on the selection split, fallback) → quantize (prepare … engine) with the chosen config

A driver above the stages (``quantcore.pipeline``): each candidate (``quantcore.auto.candidates``) is a
``quantize`` run of its own, calibrated on most of the calibration data and scored on the rest, the
selection split (``quantcore.auto.selection``); the final evaluation data is used only by the final run. How
candidates are scored, bounded by the budget and, when none meets the objective, completed by the
accuracy-target method, is ``quantcore.auto.search``'s docstring; how a later candidate must beat an earlier
one, ``quantcore.auto.scoring``'s. The final run calibrates on every calibration sample and evaluates on the
user's evaluation data: what depends on the amount of data, the calibrated ranges and the clip search, is
derived again on all of it, so that a candidate chosen as given gives the fixed recipe's model on the same
data (its clip chosen on the candidates' fewer samples could differ). The final run's layer-wise analysis is
held to what the budget left it (left out where the first candidate's analysis probe was stopped by the budget), and
where even the final run without the analysis would not fit, it keeps the clip the chosen candidate's run
kept instead of searching again (``quantcore.auto.budget``); the reason says so. Where the deployment
favours latency (``cpu_objective="latency"``) and the most accurate candidate meets the objective, a
candidate that meets it too and whose deployed model is clearly faster runs instead
(``quantcore.auto.speed``). The files and the report
are those of the chosen model, its ``config`` the one run (strategy ``fixed``: running it again gives the
same files) and its ``auto`` section every candidate tried (``search_report``).

Progress: stage ``auto`` from 0.0 to 1.0 over the search (one message per candidate with its score),
then the final run's stages. Cancellation is polled inside every candidate as in any run.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.analysis.accuracy_target import check_target
from quantcore.auto.budget import FinalRun, fit_final_run
from quantcore.auto.candidates import candidate_configs
from quantcore.auto.search import (
    BUDGET_SPENT,
    STAGE,
    Search,
    Tried,
    choose_among,
    fallback,
    pareto_front,
    run_candidates,
)
from quantcore.auto.selection import SELECTION_FRACTION, fp32_predictions, split_selection
from quantcore.auto.speed import SpeedChoice, faster_meeting
from quantcore.config import QuantizeConfig
from quantcore.errors import UnsupportedModelError
from quantcore.numerics.paired_scores import LEVEL
from quantcore.pipeline import QuantizeResult, quantize
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.runtime.batching import Batches, input_specs
from quantcore.tensorrt.engine import EngineResult, build_engine
from quantcore.wording import counted

__all__ = ["quantize_auto"]


def quantize_auto(
    model_path: str | Path,
    calibration: Mapping[str, np.ndarray],
    evaluation: Mapping[str, np.ndarray],
    config: QuantizeConfig,
    out_dir: str | Path,
    *,
    labels: np.ndarray | None = None,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
    engine_builder: Callable[..., EngineResult] = build_engine,
    resume_from: str | Path | None = None,
) -> QuantizeResult:
    """``quantize``'s contract (same arguments, files and result) for a config with ``strategy="auto"``,
    as the module says. Raises ``InvalidDataError`` when the calibration data is too small to hold a
    selection split out, or for a ``top1_drop`` objective without labels; ``UnsupportedModelError`` when
    no candidate produced a model; ``Canceled``; what the final run raises."""
    if config.strategy != "auto":
        raise ValueError(f"quantize_auto needs strategy 'auto', got {config.strategy!r} (use quantize)")
    monitor = Monitor(progress, should_cancel)
    monitor.check(STAGE)
    monitor.report(STAGE, 0.0, f"{STAGE} started")
    objective = config.auto.objective
    check_target(objective, labels)  # the final report measures a top1_drop objective on labels
    specs = input_specs(onnx.load(str(model_path), load_external_data=False))
    split = split_selection(calibration, specs)
    selection_labels = fp32_predictions(model_path, split.selection, specs) if objective.metric == "top1_drop" else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    deadline = started + config.auto.budget_seconds
    evaluation_samples = Batches(evaluation, specs, config.batch_size, what="evaluation").num_samples
    split_sizes = (len(split.calibration_indices), len(split.selection_indices))
    final = FinalRun.of(config, split_sizes, evaluation_samples)
    with tempfile.TemporaryDirectory(prefix=".auto-", dir=out_dir) as work_dir:
        search = Search(model_path, specs, split, selection_labels, Path(work_dir), monitor, final)
        tried, stopped = run_candidates(search, candidate_configs(config), config.auto.budget_seconds, deadline)
        best = choose_among(tried, objective.higher_is_better, deadline - time.perf_counter())
        if best is None and tried[0].error != BUDGET_SPENT:
            errors = "; ".join(f"{t.name}: {t.error}" for t in tried)
            raise UnsupportedModelError(f"strategy auto: no candidate produced a model ({errors})")
        best = best or tried[0]  # the config as given, stopped by the budget before it was scored
        faster = faster_meeting(search, tried, best, config, deadline - time.perf_counter())
        kept = faster.kept
        chosen, fallen_back = kept.config, None
        if best.error is None and not best.met and _fallback_fits(tried[0], best, deadline):
            chosen, fallen_back = fallback(search, best, deadline)
    left = deadline - time.perf_counter()
    probe_stopped = next((t.probe_stopped for t in tried if t.probe_stopped is not None), None)
    notes: tuple[str, ...] = ()
    if probe_stopped is not None:  # every estimate since was made without the analysis
        chosen = replace(chosen, analysis=replace(chosen.analysis, enabled=False))
        final = final.without_analysis()
        notes = (f"the final run runs without the analysis: {probe_stopped}",)
    chosen, fitted = fit_final_run(
        chosen,
        left,
        final,
        kept.final_seconds,
        kept.analysis_seconds,
        kept.clip_seconds,
        kept.kept_clip,
        sum(split_sizes),
    )
    section = search_report(
        config,
        tried,
        best,
        fallen_back,
        stopped,
        split_sizes=split_sizes,
        final_notes=(*notes, *fitted),
        speed=faster,
    )
    section["seconds"] = round(time.perf_counter() - started, 3)
    monitor.report(STAGE, 1.0, section["reason"])
    return quantize(
        model_path,
        calibration,
        evaluation,
        chosen,
        out_dir,
        labels=labels,
        progress=progress,
        should_cancel=should_cancel,
        engine_builder=engine_builder,
        resume_from=resume_from,
        auto=section,
    )


def _why(metric: str, tried: list[Tried], best: Tried) -> str:
    """Why ``best`` was kept among the candidates (``quantcore.auto.scoring.choose``), in one clause."""
    shown = "undefined" if best.value is None else f"{best.value:.6g}"
    done = [t for t in tried if t.error is None]
    samples = best.sums.samples
    why = (
        f"of {counted(len(done), 'candidate')} that produced a model, {best.name} ({metric} {shown}) is the earliest "
        f"that no other beats beyond the {LEVEL:g} % paired bootstrap interval on the selection split's "
        f"{counted(samples, 'sample')}, those that meet the objective first"
    )
    closer = [t for t in done if t.difference is not None and t.difference["value"] > 0]
    if closer:
        top = max(closer, key=lambda t: t.difference["value"])
        d = top.difference
        why += f" ({top.name} scores higher by {d['value']:.3g}, within noise: [{d['low']:.3g}, {d['high']:.3g}])"
    return why


def _fallback_fits(first: Tried, best: Tried, deadline: float) -> bool:
    """Whether the time left holds the accuracy-target fallback from ``best`` and ``best``'s final run after it.
    The fallback is one more candidate run, its layer ranking on top: at least what the first candidate took
    without its analysis probe, the least any candidate's run does. A fallback started without that time is
    stopped by the budget, its seconds lost to the final run."""
    return deadline - time.perf_counter() > first.run_seconds + best.final_seconds


def _reason(
    objective_statement: str, metric: str, tried: list[Tried], best: Tried, fallen_back: dict[str, Any] | None
) -> tuple[str, bool]:
    """(the choice in one sentence, whether the objective was met on the selection split)."""
    if best.error is not None:
        return (
            f"the budget stopped {best.name} before it was scored (it and its final run could not both fit): the "
            f"final run is {best.name}, unscored, and no other candidate was tried",
            False,
        )
    why = _why(metric, tried, best)
    if best.met:
        return f"{why}, and it meets the objective {objective_statement}", True
    head = f"the objective {objective_statement} was not met; {why}"
    if fallen_back is None:
        return f"{head}, kept as it is: the budget left no time for the accuracy-target fallback", False
    if fallen_back["error"] is not None:
        return f"{head}, kept as it is: the accuracy-target fallback failed ({fallen_back['error']})", False
    layers = len(fallen_back["float_layers"])
    value = "undefined" if fallen_back["value"] is None else f"{fallen_back['value']:.6g}"
    met = "meets" if fallen_back["met"] else "still does NOT meet"
    return (
        f"{head}; with {counted(layers, 'layer')} kept in float by the accuracy-target method it {met} it "
        f"({metric} {value})",
        bool(fallen_back["met"]),
    )


def search_report(
    config: QuantizeConfig,
    tried: list[Tried],
    best: Tried,
    fallen_back: dict[str, Any] | None,
    stopped: str | None,
    *,
    split_sizes: tuple[int, int],
    final_notes: tuple[str, ...] = (),
    speed: SpeedChoice | None = None,
) -> dict[str, Any]:
    """The report's ``auto`` section (its fields: ``jobs.report_schema.AutoSearch``) for ``best``, the most
    accurate candidate; ``final_notes``: what the final run leaves out for the budget
    (``quantcore.auto.budget``: the analysis, the clip search again), added to the reason; ``speed``: the
    timing of the candidates that meet the objective (``quantcore.auto.speed``), its verdict added too."""
    objective = config.auto.objective
    front = pareto_front(tried, objective.higher_is_better)
    reason, met = _reason(objective.statement(), objective.metric, tried, best, fallen_back)
    speed = speed or SpeedChoice(best, None)
    speed_verdict = () if speed.entry is None else (f"the deployment favours latency: {speed.entry['verdict']}",)
    reason = "; ".join((reason, *speed_verdict, *final_notes))
    return {
        "objective": {**objective.to_dict(), "statement": objective.statement()},
        "measured_on": "the selection split, the exported model as deployed on ONNX Runtime (exact Q/DQ where the "
        "deployed session could not be built)",
        "selection": {
            "calibration_samples": split_sizes[0],
            "selection_samples": split_sizes[1],
            "fraction": SELECTION_FRACTION,
        },
        "budget_seconds": config.auto.budget_seconds,
        "candidates": [t.to_dict(t.name in front) for t in tried],
        "stopped": stopped,
        "chosen": speed.kept.name,
        "final_seconds": None if speed.kept.final_seconds is None else round(speed.kept.final_seconds, 3),
        "speed": speed.entry,
        "fallback": fallen_back,
        "met": met,
        "reason": reason,
    }
