"""Accuracy of every platform preset on the digits CNN, simulated and as deployed. Prints a table.

    .venv/bin/python -m bench.digits_platforms [--workdir DIR]

Trains the sample model (``samples.digits``), calibrates on 256 training samples and evaluates on
the 500 held-out ones, for each (platform, precision, observer) row below; reports FP32 top-1, the
exact-QDQ and deployed (ONNX Runtime's optimized graph) top-1 and output SQNR, and how many
integer kernels ONNX Runtime actually ran.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from quantcore import QuantizeConfig, quantize
from samples.digits import TRAIN_SAMPLES, build_digits

ROWS = (
    ("tensorrt", "int8", "percentile"),
    ("tensorrt", "int8", "minmax"),
    ("tensorrt", "int8", "kl"),
    ("tensorrt", "int8", "mse"),
    ("onnxruntime", "int8", "minmax"),
    ("onnxruntime", "int8", "percentile"),
    ("tensorrt-fp8", "fp8", "minmax"),
    ("academic", "w4a8", "minmax"),
    ("academic", "w4a4", "mse"),
)
INTEGER_KERNEL_PREFIXES = ("QLinear", "QGemm", "MatMulInteger", "ConvInteger", "com.microsoft.QLinear")


def integer_kernels(kernels: dict | None) -> int | None:
    if kernels is None:
        return None
    return sum(count for op, count in kernels.items() if op.split(".")[-1].startswith(INTEGER_KERNEL_PREFIXES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-digits-"))
    started = time.perf_counter()
    model_path, data_path = build_digits(workdir / "digits")
    print(f"sample trained and exported in {time.perf_counter() - started:.1f} s")
    with np.load(data_path) as archive:
        images, labels = archive["input"], archive["labels"]
    calibration = {"input": images[:256]}
    evaluation = {"input": images[TRAIN_SAMPLES:]}
    header = (
        "platform",
        "precision",
        "observer",
        "FP32",
        "exact top-1",
        "exact dB",
        "deployed top-1",
        "deployed dB",
        "int kernels",
    )
    print(" | ".join(header))
    for platform, precision, observer in ROWS:
        config = QuantizeConfig(platform=platform, precision=precision, observer=observer, cpu_latency=False)
        out = workdir / f"{platform}-{precision}-{observer}"
        report = quantize(model_path, calibration, evaluation, config, out, labels=labels[TRAIN_SAMPLES:]).report
        ev = report["evaluation"]
        exact, deployed = ev["qdq_exact"], ev["qdq_deployed"]
        cells = (
            platform,
            precision,
            observer,
            f"{ev['fp32']['top1']:.3f}",
            f"{exact['top1']:.3f}",
            f"{exact['outputs']['logits']['sqnr_db']:.1f}",
            f"{deployed['top1']:.3f}",
            f"{deployed['outputs']['logits']['sqnr_db']:.1f}",
            str(integer_kernels(deployed.get("kernels"))),
        )
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
