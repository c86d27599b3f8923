"""The run report as a JSON document: its format name, its assembly from the stages' typed results
(``quantcore.report.stage_results``; values made JSON-safe by ``quantcore.jsonable``), and its two files.

Sections, in the order report.json holds them: format, config (of the files written), prepare, annotation
(``Annotation.summary``), calibration (with the clip stage's ``percentile_search``), reconstruction, qat (the
training's options, outcome, held-out SQNR before and after, loss curve and seconds, ``quantcore.qat``; null
without it), evaluation, parity, analysis, target, latency, engine, stage_seconds, resumed, warnings (every
stage's, in stage order), auto (the search that chose the config, ``quantcore.auto``; null for strategy
``fixed``), placement (the place stage's regions and timings, ``quantcore.analysis.placement``; null where it
did not run), mixed_precision (the layers promoted to 16 bits or kept float and the effect measured on
the calibration data, ``quantcore.analysis.mixed_precision``; null where it did not run), weight_only
(platform ``onnxruntime-weight-only``: its options, the layers quantized and kept float, sizes and next-token
agreement, ``quantcore.pipeline.weight_only``; null elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantcore import atomic
from quantcore.jsonable import jsonable
from quantcore.report.html import HTML_FILE, render_html
from quantcore.report.stage_results import Analyzed, Evaluated, PreparedInputs
from quantcore.tensorrt.engine import EngineResult

REPORT_FORMAT = "quantcore.report/1"
REPORT_FILE = "report.json"


def build_report(
    inputs: PreparedInputs,
    evaluated: Evaluated,
    analyzed: Analyzed,
    latency: dict[str, Any] | None,
    engine: EngineResult | None,
    stage_seconds: Mapping[str, float],
    auto: Mapping[str, Any] | None = None,
    *,
    weight_only: Mapping[str, Any] | None = None,
    cpu_alternative: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report of a finished run, JSON-ready: ``inputs`` from prepare, ``evaluated`` for the model kept
        last (after the parity remedy and the accuracy target), ``analyzed``, the latency stage's dict and the
        engine stage's result (None: the stage did not run), each stage's wall-clock seconds, and the auto
        search's section (``quantcore.auto.search_report``; None: the config was not searched), and the weight-only
    run's section (None: a Q/DQ run), and the onnxruntime platform measured beside a model no engine was built
    for (``quantcore.pipeline.cpu_alternative``; None: not measured)."""
    model = evaluated.model
    prepared, calibrated, reconstruction = model.prepared, model.calibrated, model.reconstruction
    return jsonable(
        {
            "format": REPORT_FORMAT,
            "config": model.config.to_dict(),
            "prepare": {
                "source_opset": prepared.source_opset,
                "opset": prepared.opset,
                "folded_batchnorms": [
                    {"node": f.node, "batchnorm": f.batchnorm, "output": f.output} for f in prepared.folded_batchnorms
                ],
                "folded_constants": prepared.folded_constants,
                "divisions_as_products": list(prepared.divisions_as_products),
                "renamed_nodes": prepared.renamed_nodes,
                "widened_from": prepared.widened_from,
                "equalization": inputs.equalization,
                "smoothquant": inputs.smoothquant,
            },
            "annotation": calibrated.summary(),
            "calibration": {
                "num_samples": inputs.calibration.num_samples,
                "batch_size": inputs.calibration.batch_size,
                "num_batches": len(inputs.calibration),
                "percentile_search": model.percentile_search,
            },
            "reconstruction": None if reconstruction is None else reconstruction.summary(),
            "qat": None if model.qat is None else model.qat.summary(),
            "evaluation": evaluated.evaluation,
            "parity": evaluated.parity,
            "analysis": analyzed.analysis,
            "target": evaluated.target,
            "latency": {"cpu": latency, "cpu_alternative": cpu_alternative},
            "engine": engine.to_dict() if engine is not None else None,
            "stage_seconds": stage_seconds,
            "resumed": model.resumed,
            "warnings": [
                *prepared.warnings,
                *calibrated.warnings,
                *(reconstruction.warnings if reconstruction is not None else ()),
                *(model.qat.warnings if model.qat is not None else ()),
                *model.exported.warnings,
                *evaluated.reference_notes,
                *analyzed.warnings,
            ],
            "auto": auto,
            "placement": model.placement,
            "mixed_precision": model.mixed_precision,
            "weight_only": weight_only,
        }
    )


def write_report(out_dir: Path, report: Mapping[str, Any]) -> Path:
    """Write ``report`` into ``out_dir`` as report.html, then report.json (last: its presence marks a
    finished run), each complete or not at all (``quantcore.atomic``); returns report.json's path."""
    report_path = out_dir / REPORT_FILE
    atomic.write_bytes(out_dir / HTML_FILE, render_html(report).encode())
    atomic.write_json(report_path, report)
    return report_path
