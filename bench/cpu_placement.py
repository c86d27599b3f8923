"""CPU placement benchmark: FP32 vs the onnxruntime preset (cpu_objective accuracy, every region
quantized) vs the latency placement (cpu_objective latency), p50 ms on ONNX Runtime's CPU EP at
batch 1 and 32. Not a test; prints a Markdown table.

The three models of one network are timed together, interleaved (``quantcore.evaluate.paired_latency``),
``--reruns`` times; each cell is the median of the reruns' p50s. Networks: the digits CNN
(``samples.digits``, trained here) and the zoo (``samples.zoo``).

    .venv/bin/python -m bench.cpu_placement [--reruns 3] [--threads N] [--models digits resnet ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx

from quantcore import QuantizeConfig, quantize
from quantcore.config import AnalysisOptions
from quantcore.evaluate.cpu_latency import resolved_threads
from quantcore.evaluate.paired_latency import interleaved_times
from quantcore.runtime.batching import input_specs
from samples import zoo
from samples.digits import build_digits

ZOO = ("resnet", "mobilenet", "detector", "unet", "audio", "legacy", "transformer")
BATCHES = (1, 32)


def _data(name: str, work: Path) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    if name == "digits":
        model_path, data_path = build_digits(work / "digits")
        images = np.load(data_path)["input"]
        return model_path, {"input": images[:256]}, {"input": images[256:320]}
    built = zoo.build(name)
    path = work / f"{name}.onnx"
    onnx.save(built.model, str(path))
    return path, built.calibration, built.evaluation


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="*", default=["digits", *ZOO])
    args = parser.parse_args(argv)
    threads = resolved_threads(args.threads)
    print(f"threads {threads}; p50 ms (median of {args.reruns} interleaved reruns); speed-up = FP32 / model\n")
    print("| model | batch | FP32 | ort preset | placed | preset speed-up | placed speed-up | placed float nodes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for name in args.models:
            model_path, calibration, evaluation = _data(name, work)
            base = {"platform": "onnxruntime", "cpu_latency": False, "analysis": AnalysisOptions(enabled=False)}
            results = {
                objective: quantize(
                    model_path,
                    calibration,
                    evaluation,
                    QuantizeConfig(**base, cpu_objective=objective, cpu_threads=threads, cpu_batch_sizes=BATCHES),
                    work / f"{name}-{objective}",
                )
                for objective in ("accuracy", "latency")
            }
            models = [
                model_path.read_bytes(),
                results["accuracy"].model_path.read_bytes(),
                results["latency"].model_path.read_bytes(),
            ]
            specs = input_specs(onnx.load(str(model_path)))
            p50s: dict[int, list[list[float]]] = {b: [[], [], []] for b in BATCHES}
            for _ in range(args.reruns):
                timed = interleaved_times(
                    models, BATCHES, specs=specs, sample=evaluation, threads=threads, budget_s=2.0
                )
                for batch, times in timed.items():
                    for i, t in enumerate(times):
                        if not isinstance(t, str):
                            p50s[batch][i].append(float(np.median(t)))
            placed = results["latency"].report["placement"]
            for batch in BATCHES:
                fp32, preset, mine = (statistics.median(v) if v else float("nan") for v in p50s[batch])
                print(
                    f"| {name} | {batch} | {fp32:.4g} | {preset:.4g} | {mine:.4g} | {fp32 / preset:.2f}x | "
                    f"{fp32 / mine:.2f}x | {len(placed['float_nodes'])} ({placed['kept']}) |"
                )


if __name__ == "__main__":
    main()
