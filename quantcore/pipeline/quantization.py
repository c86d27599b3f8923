"""The stages that make the quantized model: prepare → annotate → calibrate → clip → reconstruct →
mixed_precision → qat → export, or, for a resumed run, prepare → annotate → the checkpoint in place of the rest.

``clip`` runs when activations are observed by ``percentile``, ``config.percentile_candidates`` names
others and there are at least ``clip_search.MIN_SAMPLES`` calibration samples: it keeps the percentile,
or the MSE threshold read from the same histograms, that reproduces the FP32 outputs best on the
calibration data (``quantcore.calibrate.clip_search``), and the run goes on with it (re-calibrations too).
``reconstruct`` learns the rounding when ``config.reconstruction`` is set (otherwise it reports itself
skipped at once), and so does ``mixed_precision`` when ``config.mixed_precision`` is set: it promotes the
layers the calibration data finds most sensitive to 16 bits or float
(``quantcore.analysis.mixed_precision``), and the run goes on with the config that names them.

Three options change the model these stages hand on, each off by default (and then nothing of theirs
runs): ``config.equalization`` equalizes the prepared model's layer pairs at the end of prepare
(``quantcore.prepare.equalization``), ``config.smoothquant`` then moves its MatMul/Gemm inputs' outlier
channels into their weights, in prepare because the graph annotate reads changes (a Mul may be inserted;
``quantcore.calibrate.smoothquant``, on the calibration batches), ``config.bias_correction`` corrects the
quantized layers' biases at the end of calibrate, before clip and reconstruct (``quantcore.calibrate.bias_correction``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.analysis.accuracy_target import check_target
from quantcore.analysis.mixed_precision import PromotionRun, promote
from quantcore.annotate.annotation import Annotation, annotate
from quantcore.calibrate.bias_correction import correct_biases
from quantcore.calibrate.calibration import Clip, calibrate_clips, configured_clip
from quantcore.calibrate.clip_search import MIN_SAMPLES, choose_clip
from quantcore.calibrate.smoothquant import smooth
from quantcore.config import QuantizeConfig
from quantcore.errors import UnsupportedModelError
from quantcore.evaluate.evaluation import check_labels
from quantcore.export import checkpoint
from quantcore.export.qdq import export
from quantcore.pipeline.run import Run
from quantcore.prepare.equalization import equalize
from quantcore.prepare.preparation import PreparedModel, prepare
from quantcore.qat import QatResult, qat
from quantcore.qat.checkpoint import FILE as QAT_CHECKPOINT
from quantcore.qat.checkpoint import Checkpointing
from quantcore.qat.training import check_qat_data
from quantcore.reconstruction import ReconstructionResult, reconstruct
from quantcore.report.stage_results import PreparedInputs, QuantizedModel
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.memory_plan import plan_memory


@dataclass(frozen=True)
class Calibration:
    """calibrate's result, as clip and reconstruct refine it: the calibrated configs the export writes."""

    config: QuantizeConfig  # with the clip kept applied, once the clip stage has chosen
    prepared: PreparedModel  # with the learned weights, once reconstruct has run
    candidates: dict[Clip, Annotation]  # every clip calibrated, ``configured_clip(config)`` among them
    calibrated: Annotation  # the configured clip's, then the clip kept, then reconstruct's
    percentile_search: dict[str, Any] | None = None  # the clip stage's choice, once it has run
    reconstruction: ReconstructionResult | None = None
    mixed_precision: dict[str, Any] | None = None  # the mixed_precision stage's report, once it has promoted
    qat: QatResult | None = None  # the qat stage's, once it has run


def prepare_on_data(
    model_path: str | Path, calibration: Mapping[str, np.ndarray], batch_size: int, *, external_data: bool = True
) -> tuple[PreparedModel, dict[str, np.ndarray] | None]:
    """The prepared model and the first calibration batch it was prepared on, which lets prepare fold Ifs that
    depend on input shapes or flag inputs (none with ``external_data=False``: see ``prepare``)."""
    source_specs = input_specs(onnx.load(str(model_path), load_external_data=False))
    sample = next(iter(Batches(calibration, source_specs, batch_size, what="calibration")), None)
    return prepare(model_path, sample=sample if external_data else None, external_data=external_data), sample


def prepare_stage(run: Run, config: QuantizeConfig, *, external_data: bool = True) -> PreparedInputs:
    """Prepare the model and check the data against it, before any slow stage: batches both data sets
    for the prepared model, checks the labels, the target and QAT's labels and tensor names, and prices the
    analysis' memory. Raises ``InvalidModelError``, ``UnsupportedModelError`` (also: a target whose ranking
    cannot fit), or ``InvalidDataError``. With ``config.equalization``, the prepared model is equalized; with
    ``config.smoothquant``, then smoothed (the smoothed graph has the same inputs: the batches stand).
    ``external_data=False``: the prepared model's external tensors stay in their files (``prepare``'s)."""
    started = run.clock.begin("prepare")
    prepared, sample = prepare_on_data(run.model_path, run.calibration, config.batch_size, external_data=external_data)
    done = f"folded {len(prepared.folded_batchnorms)} BatchNormalization, {prepared.folded_constants} constant nodes"
    rewrites: dict[str, dict[str, Any]] = {}
    if config.equalization:
        prepared, equalization = equalize(prepared)
        done = f"{done}; {equalization.statement()}"
        rewrites["equalization"] = equalization.summary()
    specs = input_specs(prepared.model)
    calibration = Batches(run.calibration, specs, config.batch_size, what="calibration")
    evaluation = Batches(run.evaluation, specs, config.batch_size, what="evaluation")
    check_labels(run.labels, evaluation.total_samples, evaluation.num_samples)
    check_target(config.target, run.labels)
    if config.qat is not None:
        check_qat_data(config.qat, prepared.model, run.calibration_labels)
    if config.smoothquant:  # after the data checks: it runs the model on the calibration data
        prepared, smoothing = smooth(prepared, calibration, config, run.monitor)
        done = f"{done}; {smoothing.statement()}"
        rewrites["smoothquant"] = smoothing.summary()
    memory = plan_memory(prepared.model)  # priced now: a target that needs the analysis fails before the slow stages
    for option, name in ((config.target, "the accuracy target"), (config.mixed_precision, "mixed precision")):
        if option is not None and memory.skip is not None:
            raise UnsupportedModelError(f"{name} needs the layer-wise ranking, but {memory.skip}")
    run.clock.end("prepare", started, done)
    return PreparedInputs(prepared, sample, calibration, evaluation, memory, **rewrites)


def annotate_stage(run: Run, inputs: PreparedInputs, config: QuantizeConfig) -> Annotation:
    """The platform's annotation of the prepared model (configs not yet calibrated)."""
    started = run.clock.begin("annotate")
    annotation = annotate(inputs.prepared, config)
    run.clock.end(
        "annotate",
        started,
        f"{len(annotation.activations)} activations, {len(annotation.parameters)} weights to quantize",
    )
    return annotation


def restore_checkpoint(
    run: Run,
    inputs: PreparedInputs,
    annotation: Annotation,
    config: QuantizeConfig,
    key: str,
    resume_from: str | Path | None,
) -> QuantizedModel | None:
    """The model a valid checkpoint in ``resume_from`` holds (``key``: ``checkpoint.fingerprint`` of this
    run), in place of calibrate, clip and export: no progress, the configs read back from its tqc.json,
    the clip it kept applied to ``config``. None (the stages run) without ``resume_from``, with a
    reconstruction, QAT, a bias correction or mixed precision (the checkpoint holds neither the learned or
    trained model, the corrected biases nor the promotions), or with no valid checkpoint there."""
    if resume_from is None or config.reconstruction is not None or config.bias_correction:
        return None
    if config.mixed_precision is not None or config.qat is not None:
        return None
    restored = checkpoint.load(Path(resume_from), run.out_dir, key)
    if restored is None:
        return None
    exported, percentile_search = restored.exported, restored.percentile_search
    calibrated = checkpoint.restore_configs(annotation, exported.tqc_path)
    resumed: tuple[str, ...] = ("calibrate", "export")
    if percentile_search is not None:  # re-calibrations (remedy, target) go on with the clip kept
        config = replace(config, percentile=percentile_search["chosen"], clip=percentile_search["clip"])
        resumed = ("calibrate", "clip", "export")
    return QuantizedModel(
        config,
        inputs.prepared,
        annotation,
        calibrated,
        exported,
        percentile_search,
        None,
        resumed,
        calibration_seconds=restored.calibration_seconds,
    )


def calibrate_stage(run: Run, inputs: PreparedInputs, annotation: Annotation, config: QuantizeConfig) -> Calibration:
    """Calibrate ``annotation`` on the calibration batches: for the configured clip, and, when the clip
    stage will search, for each of ``config.percentile_candidates`` and the MSE threshold too (one pass).
    With ``config.bias_correction``, then the biases corrected for the configured clip's weight configs
    (the weights' configs are the same for every clip)."""
    started = run.clock.begin("calibrate")
    batches = inputs.calibration
    enough = batches.num_samples >= MIN_SAMPLES
    searched = (*config.percentile_candidates, "mse") if enough and config.percentile_candidates else ()
    candidates = calibrate_clips(
        inputs.prepared,
        annotation,
        batches,
        config,
        searched,
        progress=run.monitor.progress,
        should_cancel=run.monitor.should_cancel,
    )
    calibrated = candidates[configured_clip(config)]
    prepared, done = inputs.prepared, f"calibrated on {batches.num_samples} samples"
    if config.bias_correction:
        prepared, correction = correct_biases(prepared, calibrated, batches, config, run.monitor)
        done = f"{done}; {correction.statement()}"
    run.clock.end("calibrate", started, done)
    return Calibration(config, prepared, candidates, calibrated)


def clip_stage(run: Run, inputs: PreparedInputs, calibration: Calibration) -> Calibration:
    """The candidate clip that reproduces the FP32 outputs best, applied to the config (the stage runs,
    and reports, only when calibrate produced more than one candidate; otherwise ``calibration``)."""
    if len(calibration.candidates) <= 1:
        return calibration
    started = run.clock.begin("clip")
    choice = choose_clip(
        calibration.prepared, calibration.candidates, inputs.calibration, calibration.config, run.monitor
    )
    chosen = replace(
        calibration,
        config=choice.applied(calibration.config),
        calibrated=choice.annotation,
        percentile_search=choice.to_dict(),
    )
    run.clock.end("clip", started, choice.statement)
    return chosen


def reconstruct_stage(run: Run, inputs: PreparedInputs, calibration: Calibration) -> Calibration:
    """``calibration`` with learned rounding (AdaRound/BRECQ/QDrop) when ``config.reconstruction`` is set:
    the model's weights and the configs replaced by reconstruct's; otherwise unchanged (reported skipped)."""
    started = run.clock.begin("reconstruct")
    config = calibration.config
    if config.reconstruction is None:
        run.clock.end("reconstruct", started, "skipped: no reconstruction in the config")
        return calibration
    reconstruction = reconstruct(
        calibration.prepared,
        calibration.calibrated,
        inputs.calibration,
        config,
        progress=run.monitor.progress,
        should_cancel=run.monitor.should_cancel,
    )
    run.clock.end("reconstruct", started, f"{config.reconstruction.method}: {len(reconstruction.blocks)} blocks")
    return replace(
        calibration,
        prepared=reconstruction.prepared,
        calibrated=reconstruction.annotation,
        reconstruction=reconstruction,
    )


def mixed_precision_stage(
    run: Run, inputs: PreparedInputs, annotation: Annotation, calibration: Calibration
) -> tuple[Annotation, Calibration]:
    """With ``config.mixed_precision``: the promotion ``quantcore.analysis.mixed_precision`` keeps, as the
    annotation (before calibration) and the calibration export writes, its config naming the promotions;
    otherwise both unchanged (reported skipped)."""
    started = run.clock.begin("mixed_precision")
    config = calibration.config
    if config.mixed_precision is None:
        run.clock.end("mixed_precision", started, "skipped: no mixed precision in the config")
        return annotation, calibration
    promotion = promote(
        PromotionRun(calibration.prepared, inputs.calibration, annotation, calibration.calibrated, inputs.memory.cones),
        config,
        run.monitor,
    )
    run.clock.end("mixed_precision", started, promotion.report["statement"])
    return promotion.annotation, replace(
        calibration, config=promotion.config, calibrated=promotion.calibrated, mixed_precision=promotion.report
    )


def qat_stage(
    run: Run, inputs: PreparedInputs, calibration: Calibration, key: str, resume_from: str | Path | None
) -> Calibration:
    """``calibration`` with the model trained by distillation (``quantcore.qat``) when ``config.qat`` is set:
    the weights and configs replaced by the ones trained, or left as they were when QAT kept the
    post-training model or skipped (the reason in the stage's message and the report); otherwise
    unchanged (reported skipped). Training is checkpointed in ``run.out_dir`` under ``key`` (this run's
    ``checkpoint.fingerprint``) and resumed from a checkpoint of that key in ``resume_from``."""
    started = run.clock.begin("qat")
    config = calibration.config
    if config.qat is None:
        run.clock.end("qat", started, "skipped: no qat in the config")
        return calibration
    result = qat(
        calibration.prepared,
        calibration.calibrated,
        inputs.calibration,
        config,
        labels=run.calibration_labels,
        progress=run.monitor.progress,
        should_cancel=run.monitor.should_cancel,
        checkpointing=Checkpointing(
            run.out_dir / QAT_CHECKPOINT, None if resume_from is None else Path(resume_from) / QAT_CHECKPOINT, key
        ),
    )
    run.clock.end("qat", started, result.statement())
    return replace(calibration, prepared=result.prepared, calibrated=result.annotation, qat=result)


def export_stage(run: Run, annotation: Annotation, calibration: Calibration, key: str) -> QuantizedModel:
    """Write the QDQ model and its tqc.json into ``run.out_dir``, then checkpoint.json (``key``: this run's
    ``checkpoint.fingerprint``), which a resumed run may reuse in place of calibrate, clip and export."""
    started = run.clock.begin("export")
    config = calibration.config
    exported = export(calibration.prepared, calibration.calibrated, run.out_dir, platform=config.platform)
    seconds = run.clock.seconds.get("calibrate", 0.0)
    checkpoint.save(run.out_dir, key, exported, calibration.percentile_search, seconds)
    run.clock.end(
        "export",
        started,
        f"{exported.quantize_linear_nodes} QuantizeLinear, {exported.dequantize_linear_nodes} DequantizeLinear",
    )
    return QuantizedModel(
        config,
        calibration.prepared,
        annotation,
        calibration.calibrated,
        exported,
        calibration.percentile_search,
        calibration.reconstruction,
        resumed=(),
        mixed_precision=calibration.mixed_precision,
        qat=calibration.qat,
        calibration_seconds=seconds,
    )
