"""Reconstruction on trained models at W4A4 (platform academic), each method's exported QDQ model measured by
ONNX Runtime on the 500 held-out digits: the sample CNN, whose top-1 W4A4 barely moves (the methods are
told apart by the logits' SQNR), and a narrow ResNet, where W4A4 costs top-1 itself."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from quantcore import QuantizeConfig, ReconstructionConfig, annotate, calibrate, export, prepare, reconstruct
from quantcore.runtime.session import open_session

ITERS = 200  # a CPU test budget; the papers use 20000 steps per block
NOISE = 2 / 500  # two held-out samples: below this, top-1 differences are noise
SQNR_NOISE = 0.3  # dB; a judgment (one seed measured), about a fifth of the RTN→AdaRound gain


def measure(path, images: np.ndarray, labels: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(top-1, SQNR in dB of the logits against FP32's)."""
    with open_session(path, exact_qdq=True) as session:
        logits = session.run(None, {"input": images})[0]
    sqnr = 10 * np.log10((reference**2).sum() / ((logits - reference) ** 2).sum())
    return float((logits.argmax(1) == labels).mean()), float(sqnr)


@pytest.fixture(scope="module")
def results(digits_sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("digits-recon")
    images, labels = digits_sample.evaluation["input"], digits_sample.evaluation_labels
    calibration = {"input": digits_sample.images[:512]}
    with open_session(digits_sample.model_path) as session:
        reference = session.run(None, {"input": images})[0]
    base = QuantizeConfig(platform="academic", precision="w4a4", observer="minmax", cpu_latency=False)
    prepared = prepare(digits_sample.model_path)
    annotation = calibrate(prepared, annotate(prepared, base), calibration, base)
    measured = {
        "fp32": (float((reference.argmax(1) == labels).mean()), float("inf")),
        "rtn": measure(export(prepared, annotation, out / "rtn").model_path, images, labels, reference),
    }
    reports = {}
    for method in ("adaround", "brecq", "qdrop"):
        config = QuantizeConfig(
            platform="academic",
            precision="w4a4",
            observer="minmax",
            cpu_latency=False,
            reconstruction=ReconstructionConfig(method=method, iters=ITERS, num_samples=512, threads=1),
        )
        result = reconstruct(prepared, annotation, calibration, config)
        reports[method] = result
        measured[method] = measure(
            export(result.prepared, result.annotation, out / method).model_path, images, labels, reference
        )
    return measured, reports


def test_order_rtn_adaround_brecq_qdrop(results) -> None:
    measured, _ = results
    acc = {name: top1 for name, (top1, _) in measured.items()}
    sqnr = {name: value for name, (_, value) in measured.items()}
    # Logits move closer to FP32 (SQNR, dB): AdaRound strictly above RTN; BRECQ and QDrop not below the
    # previous method by more than SQNR_NOISE (measured here, seed 0, 200 steps: RTN 18.8, AdaRound 21.3,
    # BRECQ 22.2, QDrop 22.7 dB)
    assert sqnr["adaround"] > sqnr["rtn"]
    assert sqnr["brecq"] >= sqnr["adaround"] - SQNR_NOISE
    assert sqnr["qdrop"] >= sqnr["brecq"] - SQNR_NOISE
    assert sqnr["qdrop"] > sqnr["rtn"] + 1.0  # a real gain: a quarter of the logit error removed
    # top-1: the W4A4 gap on this easy task is 0-2 samples of 500 (0 where the model was trained on a
    # Xeon with AVX-512: FP32 and RTN both 0.996; RTN below FP32 on an EPYC), so the order holds within
    # NOISE; the logits' SQNR above is what separates the methods
    assert acc["rtn"] <= acc["fp32"]
    assert acc["adaround"] >= acc["rtn"] - NOISE
    assert acc["brecq"] >= acc["adaround"] - NOISE
    assert acc["qdrop"] >= acc["brecq"] - NOISE


def test_every_reconstructed_block_lowered_its_loss(results) -> None:
    _, reports = results
    for method, result in reports.items():
        learned = [b for b in result.blocks if b.status == "reconstructed"]
        assert learned, method
        assert all(b.loss_after < b.loss_before for b in learned)
        assert all(b.status in ("reconstructed", "kept_nearest") for b in result.blocks)


# The narrow ResNet (samples.trained, 4 channels wide) is where W4A4 costs top-1 itself: measured
# FP32 97.0 / RTN 93.8 % here (Xeon), 97.2 / 94.6 on an EPYC (bench.reconstruct), so the accuracy order and
# the share of the gap QDrop closes can be asserted in accuracy, not only in the logits' SQNR.
NARROW_SEEDS = (0, 1, 2)
# points of top-1 between two methods' means over NARROW_SEEDS that count as noise: a method's seed-to-seed
# std was 0.0 to 0.5 points on both CPUs (bench.reconstruct), so a difference of two 3-seed means has a std
# of at most about 0.4 points; 0.6 is 1.5 of those, 3 of the 500 held-out samples
NARROW_NOISE = 0.006


@pytest.fixture(scope="module")
def narrow_results(tmp_path_factory):
    """{method: mean held-out top-1 over NARROW_SEEDS} for FP32, RTN and the three methods at W4A4
    (academic, percentile 99.99 activations, 1024 training samples), each exported and run by ONNX Runtime."""
    from samples.digits import TRAIN_SAMPLES, load_dataset
    from samples.trained import build_resnet

    out = tmp_path_factory.mktemp("narrow-recon")
    model_path = build_resnet(out, width=4)
    images, labels = load_dataset(0)
    calibration = {"input": images[:1024]}
    heldout, heldout_labels = images[TRAIN_SAMPLES:], labels[TRAIN_SAMPLES:]
    with open_session(model_path) as session:
        reference = session.run(None, {"input": heldout})[0]
    base = QuantizeConfig(platform="academic", precision="w4a4", cpu_latency=False)
    prepared = prepare(model_path)
    annotation = calibrate(prepared, annotate(prepared, base), calibration, base)
    top1 = {
        "fp32": float((reference.argmax(1) == heldout_labels).mean()),
        "rtn": measure(export(prepared, annotation, out / "rtn").model_path, heldout, heldout_labels, reference)[0],
    }
    for method in ("adaround", "brecq", "qdrop"):
        runs = []
        for seed in NARROW_SEEDS:
            recon = ReconstructionConfig(method=method, iters=ITERS, num_samples=1024, threads=1, seed=seed)
            result = reconstruct(prepared, annotation, calibration, replace(base, reconstruction=recon))
            path = export(result.prepared, result.annotation, out / f"{method}-{seed}").model_path
            runs.append(measure(path, heldout, heldout_labels, reference)[0])
        top1[method] = float(np.mean(runs))
    return top1


def test_top1_order_and_qdrop_closes_most_of_the_gap_where_w4a4_costs_accuracy(narrow_results) -> None:
    top1 = narrow_results
    gap = top1["fp32"] - top1["rtn"]
    # measured here (Xeon, 200 steps): FP32 97.0, RTN 93.8, AdaRound 96.7, BRECQ 96.9, QDrop 97.0 %
    assert gap >= 5 / 500  # the premise: W4A4 rounding costs this model real accuracy (16 samples here)
    assert top1["adaround"] > top1["rtn"] + NARROW_NOISE
    assert top1["brecq"] >= top1["adaround"] - NARROW_NOISE
    assert top1["qdrop"] >= top1["brecq"] - NARROW_NOISE
    # "most of the gap": more than half of the RTN-to-FP32 top-1 loss recovered (here 100 %)
    assert (top1["qdrop"] - top1["rtn"]) / gap > 0.5
