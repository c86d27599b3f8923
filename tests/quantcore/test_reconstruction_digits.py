"""Reconstruction on a trained model: the digits CNN at W4A4 (platform academic), each method's exported
QDQ model measured by ONNX Runtime on the 500 held-out samples."""

from __future__ import annotations

import numpy as np
import pytest

from quantcore import QuantizeConfig, ReconstructionConfig, annotate, calibrate, export, prepare, reconstruct
from quantcore.session import open_session

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
