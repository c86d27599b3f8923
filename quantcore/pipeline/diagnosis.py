"""The stages that find where the error comes from and, asked to, act on it: analyze → target.

``analyze`` (``quantcore.analysis.ranking``, unless ``config.analysis.enabled`` is off) measures each
quantized tensor's and each layer's error, where the machine has the memory it needs
(``quantcore.runtime.memory_plan``, priced after ``prepare``: otherwise the report's analysis is null and a
warning says why; a run that would not fit at all is refused there). It is a diagnosis, run on models
of its own (switchable, gated, twin: ``quantcore.analysis.switch``): when ONNX Runtime or quantcore fails
on those, the run goes on without it, its report's analysis null and a warning naming the error, unless
a ``target`` needs its ranking;
``target`` runs only with ``config.target`` (``quantcore.analysis.accuracy_target``): it keeps the most harmful
layers in float until the target is met and replaces the exported files with the model kept;
``report["target"]["met"]`` says whether it was.
"""

from __future__ import annotations

from dataclasses import replace

from quantcore.analysis.accuracy_target import TargetRun, reach_target
from quantcore.analysis.ranking import analyze
from quantcore.errors import Canceled, QuantcoreError
from quantcore.evaluate.parity import check_parity
from quantcore.pipeline.run import Run
from quantcore.report.stage_results import Analyzed, Evaluated, PreparedInputs
from quantcore.runtime.session import RUNTIME_ERRORS, error_line


def analysis_failure(error: Exception) -> str:
    """The warning for an analysis that failed: what is missing, what is not, and the error's first line."""
    return (
        "the analysis failed, so the report has no per-tensor or per-layer errors (the exported model and its "
        f"evaluation are unaffected): {error_line(error)}"
    )


def analyze_stage(run: Run, inputs: PreparedInputs, evaluated: Evaluated) -> Analyzed:
    """Rank the tensors and layers of the evaluated model by harm, as the module says. Runs (and reports)
    when ``config.analysis.enabled`` or a target needs the ranking; raises what the analysis raised only
    when canceled or when a target needs it."""
    model = evaluated.model
    config = model.config
    if not (config.analysis.enabled or config.target is not None):  # the target search needs the ranking
        return Analyzed(None)
    started = run.clock.begin("analyze")
    memory = inputs.memory
    if memory.skip is not None:
        run.clock.end("analyze", started, memory.skip)
        return Analyzed(None, (memory.skip,))
    try:
        analysis = analyze(
            model.prepared, model.calibrated, run.evaluation, config, monitor=run.monitor, cones=memory.cones
        )
    except (QuantcoreError, *RUNTIME_ERRORS) as error:
        if isinstance(error, Canceled) or config.target is not None:
            raise
        failure = analysis_failure(error)
        run.clock.end("analyze", started, failure)
        return Analyzed(None, (failure,))
    run.clock.end("analyze", started, analysis["layerwise"]["statement"])
    return Analyzed(analysis)


def target_stage(run: Run, inputs: PreparedInputs, evaluated: Evaluated, analyzed: Analyzed) -> Evaluated:
    """With ``config.target``: the model the accuracy target search keeps (its files replace the exported
    ones in ``run.out_dir``), with its evaluation, its parity measured anew and the target's report.
    Without: ``evaluated`` unchanged, and the stage neither runs nor reports."""
    model = evaluated.model
    if model.config.target is None:
        return evaluated
    started = run.clock.begin("target")
    target_run = TargetRun(
        run.model_path,
        model.prepared,
        inputs.calibration,
        run.evaluation,
        run.labels,
        run.out_dir,
        model.annotation,
        model.calibrated,
        model.exported,
        evaluated.reference,
    )
    ranking = [row["node"] for row in analyzed.analysis["layers"]]
    outcome = reach_target(
        target_run,
        model.config,
        evaluated.evaluation,
        ranking,
        progress=run.monitor.progress,
        should_cancel=run.monitor.should_cancel,
    )
    chosen = outcome.chosen
    kept = replace(
        evaluated,
        model=replace(model, config=chosen.config, calibrated=chosen.annotation, exported=outcome.exported),
        evaluation=chosen.evaluation,
        parity={**evaluated.parity, **check_parity(chosen.evaluation).to_dict()},  # of the model kept
        target=outcome.report,
    )
    run.clock.end("target", started, outcome.report["verdict"])
    return kept
