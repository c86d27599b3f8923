"""Mixed precision for sensitive tensors, off and on, on the zoo and the digits CNN. Prints a table.

    nice -n 5 .venv/bin/python -m bench.mixed_precision [--metric cosine|sqnr] [--threshold X]
        [--max-fraction F] [--platforms onnxruntime,tensorrt] [--models resnet,...,digits] [--workdir DIR]

For each model and platform: the default recipe (percentile with its clip search), then the same with
``mixed_precision`` (``quantcore.analysis.mixed_precision``: ranked and searched on the calibration samples
only), each evaluated on the held-out samples as deployed on ONNX Runtime (exact Q/DQ where the deployed
session cannot be built), and as exact Q/DQ (the arithmetic the Q/DQ graph states, which TensorRT builds; the
deployed session runs ONNX Runtime's integer kernels). Columns: the worst float output's SQNR (dB) deployed
and exact, and cosine deployed, off → on, the layers
promoted and to what (16 = int16/uint16 tensors, f = kept float), the quantizable layers, the seconds the
stage took. Zoo models calibrate on 16 samples and evaluate on 8 (``samples.zoo``); the digits CNN on 256
and 500 (``samples.digits``), as ``bench.digits_platforms`` does.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from quantcore import QuantizeConfig, quantize
from quantcore.analysis.accuracy_target import measure
from quantcore.config import AccuracyTarget, AnalysisOptions, MixedPrecisionConfig
from samples.digits import TRAIN_SAMPLES, build_digits
from samples.zoo import ZOO, build

DIGITS = "digits"


def _data(name: str, workdir: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(model path, calibration, evaluation) of a zoo model or the digits CNN."""
    if name == DIGITS:
        model_path, data_path = build_digits(workdir / DIGITS)
        with np.load(data_path) as archive:
            images = archive["input"]
        return model_path, {"input": images[:256]}, {"input": images[TRAIN_SAMPLES:]}
    zoo = build(name)
    path = workdir / f"{name}.onnx"
    onnx.save(zoo.model, str(path))
    return path, zoo.calibration, zoo.evaluation


def _worst(evaluation: dict, metric: str, *, exact: bool = False) -> float | None:
    """The worst float output's ``metric`` as deployed (exact Q/DQ where that was skipped), or as exact Q/DQ."""
    shown = {**evaluation, "qdq_deployed": evaluation["qdq_exact"]} if exact else evaluation
    return measure(AccuracyTarget(metric, 0.0), shown)


def _shown(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metric", choices=("cosine", "sqnr"), default="cosine")
    parser.add_argument("--threshold", type=float, default=0.99)
    parser.add_argument("--max-fraction", type=float, default=0.05)
    parser.add_argument("--platforms", default="onnxruntime,tensorrt")
    parser.add_argument("--models", default=",".join((*ZOO, DIGITS)))
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-mixed-"))
    options = MixedPrecisionConfig(args.max_fraction, AccuracyTarget(args.metric, args.threshold))
    print(f"objective {options.objective.statement()} on calibration samples, max_fraction {options.max_fraction:g}")
    print(
        "model | platform | deployed SQNR off → on (dB) | exact Q/DQ SQNR off → on (dB) | cosine off → on | promoted "
        "| quantizable layers | stage s"
    )
    print("--- | --- | --- | --- | --- | --- | --- | ---")
    for name in args.models.split(","):
        model_path, calibration, evaluation = _data(name, workdir)
        for platform in args.platforms.split(","):
            base = QuantizeConfig(platform=platform, cpu_latency=False, analysis=AnalysisOptions(enabled=False))
            off = quantize(model_path, calibration, evaluation, base, workdir / f"{name}-{platform}-off").report
            config = replace(base, mixed_precision=options)
            on = quantize(model_path, calibration, evaluation, config, workdir / f"{name}-{platform}-on").report
            section = on["mixed_precision"]
            promoted = ", ".join(
                f"{p['layer']} ({'16' if section['form'] == 'int16' else 'f'})" for p in section["promoted"]
            )
            cells = (
                name,
                platform,
                f"{_shown(_worst(off['evaluation'], 'sqnr'), 1)} → {_shown(_worst(on['evaluation'], 'sqnr'), 1)}",
                f"{_shown(_worst(off['evaluation'], 'sqnr', exact=True), 1)} → "
                f"{_shown(_worst(on['evaluation'], 'sqnr', exact=True), 1)}",
                f"{_shown(_worst(off['evaluation'], 'cosine'), 4)} → {_shown(_worst(on['evaluation'], 'cosine'), 4)}",
                promoted or "none",
                str(section["quantizable_layers"] or "not ranked"),
                f"{on['stage_seconds']['mixed_precision']:.1f}",
            )
            print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
