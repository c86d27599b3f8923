"""What ``quantize``'s stages hand on: each a frozen result, named for what it holds, read by the next
stages and, at the end, by ``quantcore.report.document.build_report``.

    prepare                                                   → PreparedInputs
    calibrate → clip → reconstruct → mixed_precision → qat → export
                                                              → QuantizedModel (or a checkpoint's, resumed)
    place (cpu_objective latency)                             → QuantizedModel, its float regions excluded
    evaluate (with the parity remedy), target                 → Evaluated
    analyze                                                   → Analyzed
    latency, engine                                           → their own (a ``cpu_latency`` dict, ``EngineResult``)

A stage that changes the model (the parity remedy, the accuracy target) returns a new result with the
changed fields replaced (``dataclasses.replace``); the report always reads the model kept last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantcore.annotate.annotation import Annotation
from quantcore.config import QuantizeConfig
from quantcore.export.qdq import ExportResult
from quantcore.prepare.preparation import PreparedModel
from quantcore.qat import QatResult
from quantcore.reconstruction import ReconstructionResult
from quantcore.runtime.batching import Batches
from quantcore.runtime.memory_plan import MemoryPlan


@dataclass(frozen=True)
class PreparedInputs:
    """The prepare stage's result: the prepared model, its data batched for it, its memory plan, and what the
    function-preserving rewrites did (``equalization``, ``smoothquant``: their summaries; None: not asked for)."""

    prepared: PreparedModel  # as prepare returned it (reconstruct's learned weights are in QuantizedModel)
    sample: dict[str, np.ndarray] | None  # the first calibration batch, batched for the model as given
    calibration: Batches
    evaluation: Batches
    memory: MemoryPlan  # priced after prepare: whether (and how) the analysis may run
    equalization: dict[str, Any] | None = None
    smoothquant: dict[str, Any] | None = None


@dataclass(frozen=True)
class QuantizedModel:
    """The exported model and everything it was made from: what export (or a resumed checkpoint) gives
    the evaluate stage, and, with ``config``, ``annotation``, ``calibrated`` and ``exported`` replaced,
    what the parity remedy and the accuracy target keep."""

    config: QuantizeConfig  # the configuration of the files written (the clip kept, remedies applied)
    prepared: PreparedModel  # with the learned weights when reconstruct ran
    annotation: Annotation  # as annotated, before calibration: the base the remedy and the target re-calibrate
    calibrated: Annotation  # the configs the files were written from
    exported: ExportResult
    percentile_search: dict[str, Any] | None  # the clip stage's choice (``ClipChoice.to_dict``); None: none ran
    reconstruction: ReconstructionResult | None  # None: no reconstruction in the config, or a resumed run
    resumed: tuple[str, ...]  # the stages a checkpoint replaced, in stage order; () for a fresh run
    placement: dict[str, Any] | None = None  # the place stage's report (``analysis.placement``); None: not run
    mixed_precision: dict[str, Any] | None = None  # its stage's report (``analysis.mixed_precision``); None: not run
    qat: QatResult | None = None  # None: no qat in the config
    calibration_seconds: float = 0.0  # the calibrate stage's, a resumed run's from its checkpoint (the place budget)


@dataclass(frozen=True)
class Evaluated:
    """The evaluate stage's result (and the target stage's, for the model it kept): the model, its
    evaluation (``quantcore.evaluate.evaluation.evaluate``'s report), its parity section and what it was
    measured against."""

    model: QuantizedModel
    evaluation: dict[str, Any]
    parity: dict[str, Any]  # ``ParityVerdict.to_dict()`` plus "remedy" and "before_remedy"
    reference: onnx.ModelProto | None  # the float32 computation of a half-precision model; None: the model as given
    reference_notes: tuple[str, ...]  # report warnings on that reference (how far the model as given is from it)
    target: dict[str, Any] | None = None  # the accuracy target's report, when a target chose the model


@dataclass(frozen=True)
class Analyzed:
    """The analyze stage's result: the ranking (``quantcore.analysis.ranking.analyze``'s report) or None
    (not asked for, no memory for it, or failed), and the warnings that say why it is missing."""

    analysis: dict[str, Any] | None
    warnings: tuple[str, ...] = ()
