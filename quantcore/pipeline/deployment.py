"""The stages that measure the exported model as it will be deployed: evaluate (with the parity remedy),
latency and engine.

Deployed accuracy equals reported accuracy: after evaluate, ``quantcore.evaluate.parity`` compares the
exported model run as exact Q/DQ with the same model on ONNX Runtime's integer kernels. When they
disagree beyond its tolerance and the platform knows the cause (u8s8 saturation without VNNI on the
onnxruntime platform), the model is re-annotated, re-calibrated, re-exported and re-evaluated with the
remedy (7-bit weights), inside the evaluate stage. When they still disagree, the ONNX Runtime graph
rewrite that causes it is looked for (``quantcore.evaluate.parity.isolate_optimizer``) and, when found,
the deployed numbers are those of a session without it. Before all that, when ONNX Runtime could not
build the exported model at full optimization, the rewrite that breaks the build is looked for the same
way (``quantcore.evaluate.parity.isolate_build_failure``) and left out from then on. The report's
``parity`` section says what was measured, what was done and why, and ``config`` is the configuration of
the files written (its ``disabled_optimizers``: what a user of the model in that ONNX Runtime must
disable too).

A half-precision model's quantization is measured against its float32 computation: the exported model
computes in float32 between its Q/DQ nodes, and ONNX Runtime may not run the model as given.

Before evaluate, with ``cpu_objective`` latency, place (``quantcore.analysis.placement``) keeps in float the
quantized regions that run slower on this CPU than in float: evaluate measures the model it keeps.

latency (FP32 vs quantized on ONNX Runtime's CPU EP, ``quantcore.evaluate.cpu_latency``, at the config's
``cpu_batch_sizes`` with its ``cpu_threads``, every core by default) and engine (a
TensorRT engine built from the QDQ model by the caller's ``engine_builder``,
``quantcore.tensorrt.engine.build_engine`` by default) each run only when the config asks for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from quantcore.analysis.placement import PlacementRun, place
from quantcore.annotate.annotation import annotate
from quantcore.calibrate.calibration import calibrate
from quantcore.config import QuantizeConfig
from quantcore.evaluate.cpu_latency import LatencySettings, resolved_threads
from quantcore.evaluate.evaluation import evaluate
from quantcore.evaluate.parity import check_parity, isolate_build_failure, isolate_optimizer, remedy
from quantcore.export.qdq import export
from quantcore.pipeline.run import Run
from quantcore.prepare import half_precision
from quantcore.prepare.preparation import load_model
from quantcore.report.stage_results import Evaluated, PreparedInputs, QuantizedModel
from quantcore.tensorrt.engine import EngineResult, cpu_latency
from quantcore.tensorrt.profiles import observed_shapes


def _evaluated(
    run: Run, reference: onnx.ModelProto | None, qdq_model: Path, config: QuantizeConfig, **options: Any
) -> dict[str, Any]:
    """``evaluate``'s report for the exported model at ``qdq_model`` under ``config`` against ``reference``
    (None: the model as given); ``options``: ``evaluate``'s other keywords (``progress``)."""
    return evaluate(
        run.model_path,
        qdq_model,
        run.evaluation,
        config,
        labels=run.labels,
        should_cancel=run.monitor.should_cancel,
        reference=reference,
        **options,
    )


def _reference(run: Run, inputs: PreparedInputs, model: QuantizedModel) -> tuple[onnx.ModelProto | None, list[str]]:
    """(the float32 computation of a half-precision model, None for a float32 one; report warnings on how
    far the model as given, run by ONNX Runtime, is from it)."""
    widened_from = model.prepared.widened_from
    if not widened_from:
        return None, []
    reference = load_model(run.model_path)
    half_precision.widen(reference)
    if inputs.sample is None:
        return reference, []
    return reference, [half_precision.given_model_cost(run.model_path, reference, inputs.sample, widened_from)]


def evaluate_stage(run: Run, inputs: PreparedInputs, model: QuantizedModel) -> Evaluated:
    """Evaluate the exported model (exact Q/DQ and as deployed), then apply the parity remedies the module
    describes, in its order; returns the model kept (re-exported into ``run.out_dir`` by the 7-bit
    remedy), its evaluation and its parity section."""
    started = run.clock.begin("evaluate")
    reference, reference_notes = _reference(run, inputs, model)
    evaluation = _evaluated(run, reference, model.exported.model_path, model.config, progress=run.monitor.progress)
    verdict = check_parity(evaluation)
    parity: dict[str, Any] = {**verdict.to_dict(), "remedy": None, "before_remedy": None}
    remedies = []
    config, current = model.config, verdict
    deployed = evaluation["qdq_deployed"]
    if deployed["fallback"] or deployed["skipped"]:  # full optimization could not build the exported model
        rebuilt = isolate_build_failure(config, model.exported.model_path)
        if rebuilt is not None:
            config, reason = rebuilt
            remedies.append(reason)
            evaluation = _evaluated(run, reference, model.exported.model_path, config)
            current = check_parity(evaluation)
    fix = remedy(config) if current.agree is False else None
    if fix is not None:
        config, reason = fix
        remedies.append(reason)
        annotation = annotate(model.prepared, config)
        calibrated = calibrate(
            model.prepared, annotation, inputs.calibration, config, should_cancel=run.monitor.should_cancel
        )
        exported = export(model.prepared, calibrated, run.out_dir, platform=config.platform)
        model = replace(model, annotation=annotation, calibrated=calibrated, exported=exported)
        evaluation = _evaluated(run, reference, exported.model_path, config)
    if check_parity(evaluation).agree is False:
        qdq_model = model.exported.model_path
        isolated = isolate_optimizer(config, lambda candidate: _evaluated(run, reference, qdq_model, candidate))
        if isolated is not None:
            config, evaluation = isolated.config, isolated.evaluation
            remedies.append(isolated.reason)
    if remedies:
        parity = {
            **check_parity(evaluation).to_dict(),
            "remedy": "; ".join(remedies),
            "before_remedy": verdict.to_dict(),
        }
    run.clock.end("evaluate", started, f"evaluated on {evaluation['num_samples']} samples")
    return Evaluated(replace(model, config=config), evaluation, parity, reference, tuple(reference_notes))


def place_stage(run: Run, inputs: PreparedInputs, model: QuantizedModel) -> QuantizedModel:
    """With ``config.cpu_objective == "latency"``: the model ``quantcore.analysis.placement`` keeps (its
    float regions in the config's exclusions, its files replacing the exported ones in ``run.out_dir``),
    with the placement's report. Otherwise ``model`` unchanged, and the stage neither runs nor reports."""
    if model.config.cpu_objective != "latency":
        return model
    started = run.clock.begin("place")
    placement_run = PlacementRun(
        model.prepared,
        inputs.calibration,
        inputs.sample,
        model.annotation,
        model.calibrated,
        model.exported,
        run.out_dir,
        model.calibration_seconds,
    )
    outcome = place(placement_run, model.config, monitor=run.monitor)
    run.clock.end("place", started, outcome.report["statement"])
    return replace(
        model,
        config=outcome.config,
        annotation=outcome.annotation,
        calibrated=outcome.calibrated,
        exported=outcome.exported,
        placement=outcome.report,
    )


def latency_stage(run: Run, inputs: PreparedInputs, evaluated: Evaluated) -> dict[str, Any] | None:
    """With ``config.cpu_latency``: ``cpu_latency``'s report of the model as given (or its float32
    computation, for a half-precision model, with a note saying so) against the kept QDQ model, on the
    first evaluation batch, in the session its ``disabled_optimizers`` allow. Otherwise None."""
    model = evaluated.model
    if not model.config.cpu_latency:
        return None
    started = run.clock.begin("latency")
    sample = next(iter(inputs.evaluation), None)
    reference = evaluated.reference
    config = model.config
    latency = cpu_latency(
        run.model_path if reference is None else reference,
        model.exported.model_path,
        sample=sample,
        settings=LatencySettings(batch_sizes=config.cpu_batch_sizes, threads=resolved_threads(config.cpu_threads)),
        disabled_optimizers=model.config.disabled_optimizers,
        monitor=run.monitor,
    )
    if reference is not None:
        computes = model.prepared.widened_from
        latency["notes"].append(f"FP32 is the float32 computation of a model that computes in {computes}")
    run.clock.end("latency", started, "FP32 vs quantized on the CPU EP")
    return latency


def engine_stage(
    run: Run, inputs: PreparedInputs, evaluated: Evaluated, engine_builder: Callable[..., EngineResult]
) -> EngineResult | None:
    """With ``config.tensorrt_engine``: ``engine_builder``'s result for the kept QDQ model, built into
    ``run.out_dir / "engine"`` with optimization profiles from the calibration data's observed shapes.
    Otherwise None."""
    model = evaluated.model
    if not model.config.tensorrt_engine:
        return None
    started = run.clock.begin("engine")
    batches = inputs.calibration
    engine = engine_builder(
        model.exported.model_path,
        run.out_dir / "engine",
        fp32_model_path=run.model_path,
        evaluation=run.evaluation,
        calibration_shapes=observed_shapes(run.calibration, batches.batch_size, batches.specs),
        progress=run.monitor.progress,
        should_cancel=run.monitor.should_cancel,
    )
    run.clock.end("engine", started, f"engine {engine.status}" + (f": {engine.reason}" if engine.reason else ""))
    return engine
