"""``quantize``: the five stages in one call, with progress, cancellation and atomic outputs.

    prepare → annotate → calibrate → clip → reconstruct → export → evaluate → analyze → target → latency → engine

``clip`` runs when activations are observed by ``percentile``, ``config.percentile_candidates`` names
others and there are at least ``clip_search.MIN_SAMPLES`` calibration samples: it keeps the percentile,
or the MSE threshold read from the same histograms, that reproduces the FP32 outputs best on the
calibration data (``quantcore.calibrate.clip_search``), and the run goes on with it (re-calibrations too).
``reconstruct`` learns the rounding when ``config.reconstruction`` is set (otherwise it reports itself
skipped at once).
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

Each stage reports ``progress(stage, 0.0, ...)`` at its start and ``progress(stage, 1.0, ...)`` at its
end (calibrate and evaluate also once per batch); ``should_cancel`` is polled before every stage and
between batches. Files appear in ``out_dir`` only complete (written under a temporary name, then
renamed): ``model.qdq.onnx`` (+ ``model.qdq.onnx.data`` beyond 2 GB), ``tqc.json``, ``checkpoint.json``
(what a resumed run may reuse, ``quantcore.export.checkpoint``), ``report.json``, ``report.html``.
A run canceled or failed after export leaves the exported files in place; ``report.json`` is written
last, so its presence marks a finished run.

Deployed accuracy equals reported accuracy: after evaluate, ``quantcore.evaluate.parity`` compares the
exported model run as exact Q/DQ with the same model on ONNX Runtime's integer kernels. When they
disagree beyond its tolerance and the platform knows the cause (u8s8 saturation without VNNI on the
onnxruntime platform), the model is re-annotated, re-calibrated, re-exported and re-evaluated with the
remedy (7-bit weights), inside the evaluate stage. When they still disagree, the ONNX Runtime graph
rewrite that causes it is looked for (``quantcore.evaluate.parity.isolate_optimizer``) and, when found, the
deployed numbers are those of a session without it. Before all that, when ONNX Runtime could not build
the exported model at full optimization, the rewrite that breaks the build is looked for the same way
(``quantcore.evaluate.parity.isolate_build_failure``) and left out from then on. The report's ``parity``
section says what was
measured, what was done and why, and ``config`` is the configuration of the files written (its
``disabled_optimizers``: what a user of the model in that ONNX Runtime must disable too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore import atomic
from quantcore.analysis.accuracy_target import TargetRun, check_target, reach_target
from quantcore.analysis.ranking import analyze
from quantcore.annotate.annotation import annotate
from quantcore.calibrate.calibration import calibrate, calibrate_clips, configured_clip
from quantcore.calibrate.clip_search import MIN_SAMPLES, choose_clip
from quantcore.config import QuantizeConfig
from quantcore.errors import Canceled, QuantcoreError, UnsupportedModelError
from quantcore.evaluate.evaluation import check_labels, evaluate
from quantcore.evaluate.parity import check_parity, isolate_build_failure, isolate_optimizer, remedy
from quantcore.export import checkpoint
from quantcore.export.qdq import export
from quantcore.jsonable import jsonable
from quantcore.prepare import half_precision
from quantcore.prepare.preparation import load_model, prepare
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.reconstruction import reconstruct
from quantcore.report.document import REPORT_FORMAT
from quantcore.report.html import HTML_FILE, render_html
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.memory_plan import plan_memory
from quantcore.runtime.session import RUNTIME_ERRORS, runtime_message
from quantcore.tensorrt.engine import EngineResult, build_engine, cpu_latency
from quantcore.tensorrt.profiles import observed_shapes

STAGES = (
    "prepare",
    "annotate",
    "calibrate",
    "clip",
    "reconstruct",
    "export",
    "evaluate",
    "analyze",
    "target",
    "latency",
    "engine",
)
REPORT_FILE = "report.json"


def analysis_failure(error: Exception) -> str:
    """The warning for an analysis that failed: what is missing, what is not, and the error's first line."""
    text = runtime_message(error) if isinstance(error, RUNTIME_ERRORS) else str(error)
    message = (text.strip().splitlines() or [""])[0][:300]
    return (
        "the analysis failed, so the report has no per-tensor or per-layer errors (the exported model and its "
        f"evaluation are unaffected): {type(error).__name__}: {message}"
    )


@dataclass(frozen=True)
class QuantizeResult:
    model_path: Path  # the QDQ ONNX model
    tqc_path: Path  # every quantized tensor's config, JSON
    report_path: Path  # the report below, JSON
    # (report.html beside it: the same report as a standalone page, ``quantcore.report.html``)
    report: dict[str, Any]
    model_data_path: Path | None = None  # the model's external data (``model.qdq.onnx.data``), beyond 2 GB
    engine_path: Path | None = None  # the TensorRT engine, when one was built
    engine_metadata_path: Path | None = None  # its engine.json


class _Stages:
    """Runs the stage protocol: cancel check, start/end progress, wall-clock time per stage."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.seconds: dict[str, float] = {}

    def begin(self, stage: str) -> float:
        self.monitor.check(stage)
        self.monitor.report(stage, 0.0, f"{stage} started")
        return time.perf_counter()

    def end(self, stage: str, started: float, message: str) -> None:
        self.seconds[stage] = round(time.perf_counter() - started, 3)
        self.monitor.report(stage, 1.0, message)


def quantize(
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
    """Quantize the FP32 ONNX model at ``model_path`` to a QDQ model for ``config.platform`` in ``out_dir``.

    calibration / evaluation: ``{input name: array}``, samples along each input's batch axis
    (``quantcore.runtime.batching``: usually the first; a constant input's array is its value), batched by
    ``config.batch_size`` or the model's fixed batch dimension. labels: optional (N_eval,) integer
    class ids for top-1 accuracy. engine_builder: called like ``build_engine`` for the engine stage (a
    service passes one that builds where a GPU is, or skips with the reason). Raises
    ``InvalidModelError``, ``UnsupportedModelError``, ``InvalidDataError`` (checked before any slow
    stage), or ``Canceled``.

    After export, ``checkpoint.json`` records the exported files (``quantcore.export.checkpoint``). With
    ``resume_from`` (a directory an earlier run of the same model, calibration data and config wrote
    into, usually ``out_dir`` itself), a valid checkpoint there replaces calibrate and export (their
    calibrated configs are read back from its ``tqc.json``): those stages neither run nor report
    progress, and the report's ``resumed`` lists them. Runs with reconstruction always recompute (the
    checkpoint does not hold the learned model).
    """
    monitor = Monitor(progress, should_cancel)
    stages = _Stages(monitor)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    started = stages.begin("prepare")
    # The first calibration batch lets prepare fold Ifs that depend on input shapes or flag inputs.
    source_specs = input_specs(onnx.load(str(model_path), load_external_data=False))
    sample = next(iter(Batches(calibration, source_specs, config.batch_size, what="calibration")), None)
    prepared = prepare(model_path, sample=sample)
    specs = input_specs(prepared.model)
    calibration_batches = Batches(calibration, specs, config.batch_size, what="calibration")
    evaluation_batches = Batches(evaluation, specs, config.batch_size, what="evaluation")
    check_labels(labels, evaluation_batches.total_samples, evaluation_batches.num_samples)
    check_target(config.target, labels)
    memory = plan_memory(prepared.model)  # priced now: a target that needs the analysis fails before the slow stages
    if config.target is not None and memory.skip is not None:
        raise UnsupportedModelError(f"the accuracy target needs the layer-wise ranking, but {memory.skip}")
    stages.end(
        "prepare",
        started,
        f"folded {len(prepared.folded_batchnorms)} BatchNormalization, {prepared.folded_constants} constant nodes",
    )

    started = stages.begin("annotate")
    annotation = annotate(prepared, config)
    stages.end(
        "annotate",
        started,
        f"{len(annotation.activations)} activations, {len(annotation.parameters)} weights to quantize",
    )

    key = checkpoint.fingerprint(Path(model_path), calibration, config)
    restored = None
    if resume_from is not None and config.reconstruction is None:
        restored = checkpoint.load(Path(resume_from), out_dir, key)
    resumed = ["calibrate", "export"] if restored is not None else []
    reconstruction = percentile_search = None
    if restored is not None:
        exported, percentile_search = restored.exported, restored.percentile_search
        calibrated = checkpoint.restore_configs(annotation, exported.tqc_path)
        if percentile_search is not None:  # re-calibrations (remedy, target) go on with the clip kept
            config = replace(config, percentile=percentile_search["chosen"], clip=percentile_search["clip"])
            resumed.insert(1, "clip")
    else:
        started = stages.begin("calibrate")
        enough = calibration_batches.num_samples >= MIN_SAMPLES
        searched = (*config.percentile_candidates, "mse") if enough and config.percentile_candidates else ()
        candidates = calibrate_clips(
            prepared, annotation, calibration_batches, config, searched, progress=progress, should_cancel=should_cancel
        )
        calibrated = candidates[configured_clip(config)]
        stages.end("calibrate", started, f"calibrated on {calibration_batches.num_samples} samples")
        if len(candidates) > 1:
            started = stages.begin("clip")
            choice = choose_clip(prepared, candidates, calibration_batches, config, monitor)
            percentile_search = choice.to_dict()
            calibrated, config = choice.annotation, choice.applied(config)
            stages.end("clip", started, choice.statement)

        started = stages.begin("reconstruct")
        if config.reconstruction is not None:
            reconstruction = reconstruct(
                prepared, calibrated, calibration_batches, config, progress=progress, should_cancel=should_cancel
            )
            prepared, calibrated = reconstruction.prepared, reconstruction.annotation
        stages.end(
            "reconstruct",
            started,
            "skipped: no reconstruction in the config"
            if reconstruction is None
            else f"{config.reconstruction.method}: {len(reconstruction.blocks)} blocks",
        )

        started = stages.begin("export")
        exported = export(prepared, calibrated, out_dir, platform=config.platform)
        checkpoint.save(out_dir, key, exported, percentile_search)
        stages.end(
            "export",
            started,
            f"{exported.quantize_linear_nodes} QuantizeLinear, {exported.dequantize_linear_nodes} DequantizeLinear",
        )

    started = stages.begin("evaluate")
    # a half-precision model's quantization is measured against its float32 computation: the exported
    # model computes in float32 between its Q/DQ nodes, and ONNX Runtime may not run the model as given
    reference, reference_notes = None, []
    if prepared.widened_from:
        reference = load_model(model_path)
        half_precision.widen(reference)
        if sample is not None:
            given = half_precision.given_model_cost(model_path, reference, sample, prepared.widened_from)
            reference_notes.append(given)

    def evaluated(qdq_model: Path, run_config: QuantizeConfig, **options: Any) -> dict[str, Any]:
        return evaluate(
            model_path,
            qdq_model,
            evaluation,
            run_config,
            labels=labels,
            should_cancel=should_cancel,
            reference=reference,
            **options,
        )

    evaluation_report = evaluated(exported.model_path, config, progress=progress)
    verdict = check_parity(evaluation_report)
    parity: dict[str, Any] = {**verdict.to_dict(), "remedy": None, "before_remedy": None}
    remedies = []
    current = verdict
    deployed = evaluation_report["qdq_deployed"]
    if deployed["fallback"] or deployed["skipped"]:  # full optimization could not build the exported model
        rebuilt = isolate_build_failure(config, exported.model_path)
        if rebuilt is not None:
            config, reason = rebuilt
            remedies.append(reason)
            evaluation_report = evaluated(exported.model_path, config)
            current = check_parity(evaluation_report)
    fix = remedy(config) if current.agree is False else None
    if fix is not None:
        config, reason = fix
        remedies.append(reason)
        annotation = annotate(prepared, config)
        calibrated = calibrate(prepared, annotation, calibration_batches, config, should_cancel=should_cancel)
        exported = export(prepared, calibrated, out_dir, platform=config.platform)
        evaluation_report = evaluated(exported.model_path, config)
    if check_parity(evaluation_report).agree is False:
        isolated = isolate_optimizer(
            config,
            lambda candidate: evaluated(exported.model_path, candidate),
        )
        if isolated is not None:
            config, evaluation_report = isolated.config, isolated.evaluation
            remedies.append(isolated.reason)
    if remedies:
        parity = {
            **check_parity(evaluation_report).to_dict(),
            "remedy": "; ".join(remedies),
            "before_remedy": verdict.to_dict(),
        }
    stages.end("evaluate", started, f"evaluated on {evaluation_report['num_samples']} samples")

    analysis = target = None
    analysis_warnings = []
    if config.analysis.enabled or config.target is not None:  # the target search needs the ranking
        started = stages.begin("analyze")
        if memory.skip is None:
            try:
                analysis = analyze(prepared, calibrated, evaluation, config, monitor=monitor, cones=memory.cones)
            except (QuantcoreError, *RUNTIME_ERRORS) as error:
                if isinstance(error, Canceled) or config.target is not None:
                    raise
                failure = analysis_failure(error)
                analysis_warnings.append(failure)
                stages.end("analyze", started, failure)
            else:
                stages.end("analyze", started, analysis["layerwise"]["statement"])
        else:
            analysis_warnings.append(memory.skip)
            stages.end("analyze", started, memory.skip)
    if config.target is not None:
        started = stages.begin("target")
        run = TargetRun(
            model_path,
            prepared,
            calibration_batches,
            evaluation,
            labels,
            out_dir,
            annotation,
            calibrated,
            exported,
            reference,
        )
        ranking = [row["node"] for row in analysis["layers"]]
        outcome = reach_target(run, config, evaluation_report, ranking, progress=progress, should_cancel=should_cancel)
        config, calibrated, exported = outcome.chosen.config, outcome.chosen.annotation, outcome.exported
        evaluation_report, target = outcome.chosen.evaluation, outcome.report
        parity = {**parity, **check_parity(evaluation_report).to_dict()}  # of the model kept
        stages.end("target", started, target["verdict"])

    latency = None
    if config.cpu_latency:
        started = stages.begin("latency")
        sample = next(iter(evaluation_batches), None)
        latency = cpu_latency(
            model_path if reference is None else reference,
            exported.model_path,
            sample=sample,
            disabled_optimizers=config.disabled_optimizers,
            monitor=monitor,
        )
        if reference is not None:
            computes = prepared.widened_from
            latency["notes"].append(f"FP32 is the float32 computation of a model that computes in {computes}")
        stages.end("latency", started, "FP32 vs quantized on the CPU EP")

    engine = None
    if config.tensorrt_engine:
        started = stages.begin("engine")
        engine = engine_builder(
            exported.model_path,
            out_dir / "engine",
            fp32_model_path=model_path,
            evaluation=evaluation,
            calibration_shapes=observed_shapes(calibration, calibration_batches.batch_size, specs),
            progress=progress,
            should_cancel=should_cancel,
        )
        stages.end("engine", started, f"engine {engine.status}" + (f": {engine.reason}" if engine.reason else ""))

    report = jsonable(
        {
            "format": REPORT_FORMAT,
            "config": config.to_dict(),
            "prepare": {
                "source_opset": prepared.source_opset,
                "opset": prepared.opset,
                "folded_batchnorms": [
                    {"node": f.node, "batchnorm": f.batchnorm, "output": f.output} for f in prepared.folded_batchnorms
                ],
                "folded_constants": prepared.folded_constants,
                "renamed_nodes": prepared.renamed_nodes,
                "widened_from": prepared.widened_from,
            },
            "annotation": calibrated.summary(),
            "calibration": {
                "num_samples": calibration_batches.num_samples,
                "batch_size": calibration_batches.batch_size,
                "num_batches": len(calibration_batches),
                "percentile_search": percentile_search,
            },
            "reconstruction": None if reconstruction is None else reconstruction.summary(),
            "evaluation": evaluation_report,
            "parity": parity,
            "analysis": analysis,
            "target": target,
            "latency": {"cpu": latency},
            "engine": engine.to_dict() if engine is not None else None,
            "stage_seconds": stages.seconds,
            "resumed": resumed,
            "warnings": [
                *prepared.warnings,
                *calibrated.warnings,
                *(reconstruction.warnings if reconstruction is not None else ()),
                *exported.warnings,
                *reference_notes,
                *analysis_warnings,
            ],
        }
    )
    report_path = out_dir / REPORT_FILE
    atomic.write_bytes(out_dir / HTML_FILE, render_html(report).encode())
    atomic.write_json(report_path, report)
    built = engine is not None and engine.status == "built"
    return QuantizeResult(
        model_path=exported.model_path,
        tqc_path=exported.tqc_path,
        report_path=report_path,
        report=report,
        model_data_path=next((f for f in exported.files if f.name == f"{exported.model_path.name}.data"), None),
        engine_path=engine.engine_path if built else None,
        engine_metadata_path=engine.metadata_path if built else None,
    )
