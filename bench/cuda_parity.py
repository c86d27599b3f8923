"""CPU against CUDA for quantcore's torch side, in one process on a host whose torch sees a GPU: the
fake-quantize kernels, reconstruction (AdaRound, BRECQ, QDrop) and QAT on ``bench.reconstruct``'s models
and data (the digits CNN, the narrow ResNet and the 32-channel one; W4A4, 1024 calibration samples, 500
held-out digits).

    python -m bench.cuda_parity --workdir /tmp/cuda                 # everything
    python -m bench.cuda_parity --parts qat --models digits --epochs 4

Each training runs three times from the same calibration and seed: on the CPU (one torch thread, as
``bench.reconstruct`` and ``bench.qat`` run it), on CUDA in full float32 (TF32 off for matrix products
and convolutions), and on CUDA with torch's defaults (cuDNN convolutions in TF32), which is what a worker
runs with. Everything else (the batches, the calibration, the ONNX Runtime sessions on the CPU EP) is the
same, so the columns differ by the device's arithmetic alone, and by QDrop's drop masks, which CUDA's
generator draws differently from the CPU's.

"loss rel. diff" is the largest |CUDA - CPU| / CPU over QAT's per-epoch mean training losses, or over
reconstruction's per-block losses after training; "before" the same for reconstruction's losses at
round-to-nearest, before any training (a check of the kernels and the cache alone). Top-1 and SQNR are the
exported QDQ model's on the held-out digits (exact Q/DQ arithmetic in ONNX Runtime); "speed-up" is CPU
seconds over CUDA seconds of the training call.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.reconstruct import CALIBRATION_SAMPLES, NARROW_WIDTH, logits, measure
from quantcore import QatConfig, QuantizeConfig, ReconstructionConfig, annotate, calibrate, export, prepare
from quantcore import qat as run_qat
from quantcore import reconstruct as run_reconstruction
from quantcore.numerics.fake_quant import fake_quantize_tensor
from quantcore.numerics.policy import make_policy
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from samples.digits import TRAIN_SAMPLES, build_digits, load_dataset
from samples.trained import build_resnet

GPU = "cuda"
# run → (QuantizeConfig.device, the torch device it must train on, TF32 allowed); ``auto``: torch on the GPU,
# ONNX Runtime on its CPU EP, as a worker runs
RUNS = {"cpu": ("cpu", "cpu", False), "cuda fp32": ("auto", GPU, False), "cuda tf32": ("auto", GPU, True)}
METHODS = ("adaround", "brecq", "qdrop", "qat")


@contextlib.contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """TF32 for CUDA matrix products and cuDNN convolutions on or off, restored after."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@dataclass
class Trained:
    curve: list[float]  # QAT: per-epoch mean loss; reconstruction: per-block loss after training
    before: list[float]  # reconstruction: per-block loss at round-to-nearest; QAT: the held-out SQNR before
    top1: float
    sqnr: float
    seconds: float


def _relative(values: list[float], reference: list[float]) -> float:
    a, b = np.asarray(values, np.float64), np.asarray(reference, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30))) if b.size else float("nan")


def train_once(method: str, run: str, epochs: int, iters: int, setup: dict, out: Path) -> Trained:
    device, trains_on, allowed = RUNS[run]
    common = {"platform": "academic", "precision": "w4a4", "cpu_latency": False, "device": device}
    if method == "qat":
        config = QuantizeConfig(
            **common, qat=QatConfig(num_samples=CALIBRATION_SAMPLES, threads=1, seed=0, epochs=epochs)
        )
        started = time.perf_counter()
        with tf32(allowed):
            result = run_qat(setup["prepared"], setup["annotation"], setup["calibration"], config)
        seconds = time.perf_counter() - started
        curve, before = [e.loss for e in result.epochs], [result.before_sqnr_db]
    else:
        rc = ReconstructionConfig(method=method, iters=iters, num_samples=CALIBRATION_SAMPLES, threads=1, seed=0)
        config = QuantizeConfig(**common, reconstruction=rc)
        started = time.perf_counter()
        with tf32(allowed):
            result = run_reconstruction(setup["prepared"], setup["annotation"], setup["calibration"], config)
        seconds = time.perf_counter() - started
        done = [b for b in result.blocks if b.status == "reconstructed"]
        curve, before = [b.loss_after for b in done], [b.loss_before for b in done]
    if result.device != trains_on:
        raise RuntimeError(f"{method} with device {device!r} trained on {result.device}, not {trains_on}")
    exported = export(result.prepared, result.annotation, out)
    top1, sqnr = measure(exported.model_path, setup["heldout"], setup["labels"], setup["reference"])
    return Trained(curve, before, top1, sqnr, seconds)


def model_rows(name: str, model_path: Path, methods: list[str], epochs: int, iters: int, workdir: Path) -> list[str]:
    images, labels = load_dataset(0)
    setup = {"calibration": {"input": images[:CALIBRATION_SAMPLES]}, "heldout": images[TRAIN_SAMPLES:]}
    setup.update(labels=labels[TRAIN_SAMPLES:], reference=logits(model_path, setup["heldout"]))
    setup["prepared"] = prepare(model_path)
    base = QuantizeConfig(platform="academic", precision="w4a4", cpu_latency=False)
    setup["annotation"] = calibrate(setup["prepared"], annotate(setup["prepared"], base), setup["calibration"], base)
    rows = []
    for method in methods:
        results = {}
        for label in RUNS:
            results[label] = train_once(method, label, epochs, iters, setup, workdir / name / method / label)
            r = results[label]
            print(f"{name} {method} {label}: {r.top1:.3f} {r.sqnr:.2f} dB {r.seconds:.1f} s", file=sys.stderr)
        cpu = results["cpu"]
        for label in ("cuda fp32", "cuda tf32"):
            r = results[label]
            before = "n/a" if method == "qat" else f"{_relative(r.before, cpu.before):.1e}"
            rows.append(
                f"| {name} | {method} | {label} | {before} | {_relative(r.curve, cpu.curve):.1e} "
                f"| {100 * cpu.top1:.1f} / {100 * r.top1:.1f} | {cpu.sqnr:.2f} / {r.sqnr:.2f} "
                f"| {cpu.seconds:.1f} / {r.seconds:.1f} | {cpu.seconds / r.seconds:.1f}x |"
            )
        if method == "qat":
            curves = " ".join(f"{v:.5g}" for v in cpu.curve), " ".join(f"{v:.5g}" for v in results["cuda fp32"].curve)
            print(f"{name} qat loss per epoch, cpu: {curves[0]}\n{name} qat loss per epoch, cuda fp32: {curves[1]}")
    return rows


def kernel_rows(size: int, repeats: int) -> list[str]:
    """Forward and backward of ``fake_quantize_tensor`` with a learned scale, CPU (all its threads)
    against CUDA: the largest difference in quantization steps, and the seconds per call."""
    cases = {
        "int4 per-channel": TensorQuantConfig(
            num_bits=4,
            per_channel=True,
            channel_axis=0,
            scale=np.full(64, 0.4, np.float32),
            state=QuantState.ACTIVATED,
        ),
        "int8 per-tensor": TensorQuantConfig(scale=0.05, state=QuantState.ACTIVATED),
        "fp8 e4m3": TensorQuantConfig(policy=make_policy(floating=True), scale=0.01, state=QuantState.ACTIVATED),
    }
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, size // 64, generator=generator) * 3
    rows = []
    for label, tqc in cases.items():
        outputs, grads, seconds = {}, {}, {}
        for device in ("cpu", GPU):
            value = x.detach().to(device, copy=True).requires_grad_()
            scale = torch.tensor(np.asarray(tqc.scale, np.float32), device=device, requires_grad=True)
            timings = []
            for _ in range(repeats):
                value.grad = scale.grad = None
                started = time.perf_counter()
                out = fake_quantize_tensor(value, tqc, scale=scale)
                out.sum().backward()
                if device == "cuda":
                    torch.cuda.synchronize()
                timings.append(time.perf_counter() - started)
            outputs[device], grads[device] = out.detach().cpu(), (value.grad.cpu(), scale.grad.cpu())
            seconds[device] = float(np.median(timings[1:]))  # the first call pays for kernel loading
        step = float(np.max(np.asarray(tqc.scale)))
        out_diff = float((outputs[GPU] - outputs["cpu"]).abs().max()) / step
        x_grad_diff = float((grads[GPU][0] - grads["cpu"][0]).abs().max())
        scale_rel = _relative(grads[GPU][1].reshape(-1).tolist(), grads["cpu"][1].reshape(-1).tolist())
        rows.append(
            f"| {label} | {out_diff:.1e} | {x_grad_diff:.1e} | {scale_rel:.1e} | {1e3 * seconds['cpu']:.1f} "
            f"| {1e3 * seconds[GPU]:.2f} | {seconds['cpu'] / seconds[GPU]:.0f}x |"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="kernels,training", help="kernels, training, or both")
    parser.add_argument("--models", default="digits,narrow,resnet")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--epochs", type=int, default=10, help="QAT epochs")
    parser.add_argument("--iters", type=int, default=300, help="reconstruction steps per block")
    parser.add_argument("--kernel-size", type=int, default=1 << 24, help="values per fake-quantize call")
    parser.add_argument("--workdir", type=Path, default=None, help="models are trained here once and reused")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench.cuda_parity needs a host whose torch sees a CUDA device")
    parts = args.parts.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    if "kernels" in parts:
        print(f"\nfake_quantize_tensor on {args.kernel_size} values, forward and backward, median of 10:\n")
        print("| kernel | output diff (steps) | input grad diff | scale grad rel. diff | CPU ms | CUDA ms | speed-up |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        print("\n".join(kernel_rows(args.kernel_size, 11)))
    if "training" not in parts:
        return
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as temporary:
        workdir = args.workdir or Path(temporary)
        builders = {
            "digits": lambda: build_digits(workdir / "digits")[0],
            "narrow": lambda: build_resnet(workdir, width=NARROW_WIDTH),
            "resnet": lambda: build_resnet(workdir),
        }
        paths = {
            "digits": workdir / "digits" / "model.onnx",
            "narrow": workdir / f"resnet-{NARROW_WIDTH}.onnx",
            "resnet": workdir / "resnet-32.onnx",
        }
        rows = []
        for name in args.models.split(","):
            path = paths[name] if paths[name].exists() else builders[name]()
            torch.set_num_threads(1)  # the CPU runs as the other benches run them
            rows += model_rows(name, path, args.methods.split(","), args.epochs, args.iters, workdir / "runs")
    print(f"\nW4A4, {CALIBRATION_SAMPLES} samples, QAT {args.epochs} epochs, reconstruction {args.iters} steps:\n")
    print(
        "| model | method | CUDA run | loss rel. diff before | loss rel. diff | top-1 % CPU / CUDA "
        "| SQNR dB CPU / CUDA | seconds CPU / CUDA | speed-up |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
