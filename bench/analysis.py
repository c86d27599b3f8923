"""The analyze stage: layer-wise runs on cones against whole-model runs, on the same model and data.

    nice -n 5 .venv/bin/python -m bench.analysis --workdir /tmp/qb --models ocr-det,ocr-rec --samples 16

Each model is calibrated with the default recipe (``onnxruntime`` platform), then ``quantcore.analyze``
runs twice, each in its own process: ``whole``, every layer-wise run on the whole gated model (cones
switched off by their size limit, as before cones existed), and ``cones`` (``quantcore.analysis.cones``).
Printed per model and mode: the analyze call's wall and process CPU seconds, the layer-wise samples and
layers, the measured wall time of a layer's run against a reference run, the peak resident memory
during the call (MB; the peak is reset before it), and, for ``cones``, the largest difference of a
layer's SQNR and the layers ranked differently against ``whole``. ``--samples`` fixes the layer-wise
samples (no time budget), so both modes do the same work; ``--budget S`` instead holds both to S
seconds, as a job does (the default 120 s).

Cases are the real third-party models and the zoo of ``bench.quality``, written to ``WORKDIR/cases``
as that bench writes them (an existing case directory is reused).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.models.cases import real_cases, zoo_cases
from bench.quality import ROOT, status_mb, write_case

MODES = ("whole", "cones")
WORKER_TIMEOUT = 1800


def run_worker(mode: str, case_dir: Path, samples: int | None, budget: float | None) -> dict:
    """Calibrate the case, then time ``analyze`` in ``mode``."""
    from quantcore import AnalysisOptions, QuantizeConfig, analyze, annotate, calibrate, prepare
    from quantcore.analysis import cones as analysis_cones

    if mode == "whole":
        analysis_cones.CONE_MODEL_BYTES = -1  # no model is small enough: every run on the whole model
    calibration = dict(np.load(case_dir / "calibration.npz"))
    evaluation = dict(np.load(case_dir / "evaluation.npz"))
    config = QuantizeConfig(platform="onnxruntime", cpu_latency=False)
    prepared = prepare(case_dir / "model.onnx")
    calibrated = calibrate(prepared, annotate(prepared, config), calibration, config)
    options = AnalysisOptions(layerwise_samples=samples or 64, layerwise_seconds=None if samples else budget)
    Path("/proc/self/clear_refs").write_text("5")  # peak resident memory from here on
    base = status_mb("VmRSS")
    started, cpu_started = time.perf_counter(), time.process_time()
    report = analyze(prepared, calibrated, evaluation, config, options=options)
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "base_mb": base,
        "peak_mb": status_mb("VmHWM"),
        "layerwise": {k: v for k, v in report["layerwise"].items() if k != "bounds"},
        "layers": {row["node"]: [row["rank"], row["sqnr_db"]] for row in report["layers"]},
    }


def _differences(whole: dict, cones: dict) -> tuple[float, int]:
    """(largest |SQNR difference| of a layer measured in both, layers whose rank differs)."""
    gaps = [
        abs(a[1] - b[1])
        for node, a in whole["layers"].items()
        if (b := cones["layers"].get(node)) is not None and a[1] is not None and b[1] is not None
    ]
    ranks = sum(a[0] != cones["layers"].get(node, [None])[0] for node, a in whole["layers"].items())
    return max(gaps, default=0.0), ranks


def table(rows: list[dict]) -> str:
    lines = [
        "| model | mode | analyze s | CPU s | samples | layers | layer run / reference | peak MB (+MB) "
        "| max ΔSQNR dB | ranks moved |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['mode']} | failed: {row['error']} ||||||||")
            continue
        layerwise = row["layerwise"]
        fraction = layerwise.get("layer_run_fraction")
        gap = f"{row['max_gap_db']:.2g} | {row['ranks_moved']}" if "max_gap_db" in row else " | "
        lines.append(
            f"| {row['model']} | {row['mode']} | {row['seconds']:.1f} | {row['cpu_seconds']:.1f} | "
            f"{layerwise['samples']} | {layerwise['layers_analyzed']} | "
            f"{'' if fraction is None else format(fraction, '.2f')} | "
            f"{row['peak_mb']:.0f} (+{row['peak_mb'] - row['base_mb']:.0f}) | {gap} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ocr-det,ocr-rec", help="comma-separated model names")
    parser.add_argument("--workdir", help="where models, data and downloads go (default: a temporary directory)")
    parser.add_argument("--samples", type=int, default=16, help="layer-wise samples, no time budget (0: --budget)")
    parser.add_argument("--budget", type=float, default=120.0, help="layer-wise seconds when --samples is 0")
    parser.add_argument("--calibration-samples", type=int, default=128, help="of the third-party models")
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "CASE_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        mode, case_dir = args.worker
        print(json.dumps(run_worker(mode, Path(case_dir), args.samples, args.budget)))
        return 0

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="quantcore-bench-"))
    wanted = [name for name in args.models.split(",") if name]
    case_dirs = {name: workdir / "cases" / name for name in wanted}
    if not all((case_dir / "evaluation.npz").is_file() for case_dir in case_dirs.values()):
        cases = zoo_cases(workdir) + real_cases(workdir, args.calibration_samples)
        for case in cases:
            if case.name in case_dirs and not (case_dirs[case.name] / "evaluation.npz").is_file():
                write_case(case, workdir)
    rows = []
    for name, case_dir in case_dirs.items():
        results = {}
        for mode in MODES:
            print(f"# {name} {mode}", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "bench.analysis", "--samples", str(args.samples)]
            command += ["--budget", str(args.budget), "--worker", mode, str(case_dir)]
            row = {"model": name, "mode": mode}
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=WORKER_TIMEOUT, cwd=ROOT)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode != 0 or not lines:
                    row["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
                else:
                    results[mode] = json.loads(lines[-1])
                    row.update(results[mode])
            except subprocess.TimeoutExpired:
                row["error"] = f"timed out after {WORKER_TIMEOUT} s"
            if mode == "cones" and "whole" in results and "cones" in results:
                row["max_gap_db"], row["ranks_moved"] = _differences(results["whole"], results["cones"])
            rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
