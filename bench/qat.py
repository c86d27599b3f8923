"""QAT benchmark: quantization-aware training by distillation against round-to-nearest and the
post-training reconstructions (AdaRound, BRECQ, QDrop) on models with real accuracy.

    nice -n 5 .venv/bin/python -m bench.qat                                  # digits and narrow at W4A4, seed 0
    nice -n 5 .venv/bin/python -m bench.qat --models narrow --precisions w4a8,w4a4 --seeds 0,1,2 --epochs 20
    nice -n 5 .venv/bin/python -m bench.qat --models digits --methods '' --label-weight 0.1 --crop-padding 1

The models, data, protocol and the RTN / AdaRound / BRECQ / QDrop columns are ``bench.reconstruct``'s
(``run_model``: platform ``academic``, 1024 training samples calibrate and train, the exported QDQ model
run by ONNX Runtime with exact Q/DQ arithmetic on the 500 held-out digits). QAT starts from the same
round-to-nearest calibration: ``quantcore.qat`` on those 1024 samples (the last 20 % of them held out
to choose the epoch kept), the FP32 model's logits as targets (``--loss``), one torch thread; with
``--label-weight``, plus the cross-entropy on those samples' labels; with ``--flip`` / ``--crop-padding``,
the training images augmented (``QatAugment``). Wall time is the ``qat`` call alone (FP32 targets
included). "recovered" is (acc - RTN) / (FP32 - RTN) for QAT.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.reconstruct import CALIBRATION_SAMPLES, METHODS, NARROW_WIDTH, measure, run_model, table
from quantcore import QatConfig, QuantizeConfig, annotate, calibrate, export, prepare, qat
from quantcore.config import QatAugment
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--methods", default=",".join(METHODS), help="post-training methods beside QAT ('' for none)")
    parser.add_argument("--iters", type=int, default=300, help="reconstruction steps per block")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated: mean ± std over them")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--loss", default="mse", choices=("mse", "kl"))
    parser.add_argument("--label-weight", type=float, default=0.0, help="cross-entropy on the labels (0: none)")
    parser.add_argument("--flip", action="store_true", help="augment: random horizontal flips")
    parser.add_argument("--crop-padding", type=int, default=0, help="augment: random crops, shifts up to N px")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small models: one thread is fastest and does not fight other processes
    methods = [m for m in args.methods.split(",") if m]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    augment = QatAugment(args.flip, args.crop_padding) if args.flip or args.crop_padding else None
    options = {
        "epochs": args.epochs,
        "lr": args.lr,
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
        f"lr {args.lr:g} batch {args.batch_size} loss {args.loss} label weight {args.label_weight:g} "
        f"augment {augment}, seeds {args.seeds}"
    )
    print(table(rows, [*methods, "qat"], recovered_by="qat"))


if __name__ == "__main__":
    main()
