"""The run's device: where torch trains (reconstruction, QAT) and where ONNX Runtime's sessions run. Where
this host's torch sees a GPU, the CUDA tests train there and compare with the CPU; elsewhere they skip."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
import torch

from quantcore import QatConfig, QuantizeConfig, ReconstructionConfig, annotate, calibrate, prepare, qat, reconstruct
from quantcore.runtime.device import torch_device
from quantcore.runtime.session import providers_for
from samples.tiny import tiny_conv_model

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (none on this host)")


def test_auto_trains_on_the_gpu_where_torch_sees_one() -> None:
    assert torch_device("auto").type == ("cuda" if CUDA else "cpu")
    assert torch_device("cpu").type == "cpu"


@pytest.mark.skipif(CUDA, reason="this host has a CUDA device")
def test_cuda_by_name_without_a_gpu_is_an_error_that_says_so() -> None:
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        torch_device("cuda")


def test_auto_keeps_onnx_runtime_on_its_cpu_ep() -> None:
    # whatever build is installed (onnxruntime-gpu offers the CUDA EP): the report's sessions stay on the CPU EP
    assert providers_for("auto") == providers_for("cpu") == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert providers_for("cuda")[0] == "CUDAExecutionProvider"


def tiny_run(device: str, **training):
    """The tiny CNN at W4A4 on 40 random images, calibrated on the CPU, then trained on ``device``."""
    prepared = prepare(tiny_conv_model())
    base = QuantizeConfig(platform="academic", precision="w4a4", observer="minmax", cpu_latency=False)
    data = {"image": np.random.default_rng(0).uniform(-1, 1, (40, 3, 8, 8)).astype(np.float32)}
    annotation = calibrate(prepared, annotate(prepared, base), data, base)
    config = replace(base, device=device, **training)
    if "qat" in training:
        return qat(prepared, annotation, data, config)
    return reconstruct(prepared, annotation, data, config)


def test_a_reconstruction_and_a_qat_record_the_device_they_trained_on() -> None:
    expected = "cuda" if CUDA else "cpu"
    rc = ReconstructionConfig(method="brecq", iters=5, num_samples=32, batch_size=8, threads=1)
    assert tiny_run("auto", reconstruction=rc).device == expected
    assert tiny_run("auto", qat=QatConfig(epochs=1, batch_size=8, num_samples=40, threads=1)).device == expected


@pytest.fixture
def float32_convolutions(monkeypatch) -> None:
    """cuDNN's convolutions in float32 (torch lets them use TF32 by default), as on the CPU."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@needs_cuda
def test_qat_on_cuda_follows_the_cpu_loss_curve(float32_convolutions) -> None:
    # float32 on both devices, so the curves part only by summation order (~1e-7 relative per
    # step). A value that lands on a rounding boundary on one device and not the other moves one weight by
    # a step, so the tolerance is 1e-3 relative over 3 epochs of 4 steps, not float epsilon
    options = {"qat": QatConfig(epochs=3, batch_size=8, num_samples=40, threads=1)}
    cpu = tiny_run("cpu", **options)
    cuda = tiny_run("auto", **options)
    assert cuda.device == "cuda"
    np.testing.assert_allclose([e.loss for e in cuda.epochs], [e.loss for e in cpu.epochs], rtol=1e-3)


@needs_cuda
def test_reconstruction_on_cuda_starts_where_the_cpu_starts(float32_convolutions) -> None:
    # the loss at round-to-nearest, before any step: the same cached tensors and kernels on either device
    rc = ReconstructionConfig(method="adaround", iters=20, num_samples=32, batch_size=8, threads=1)
    cpu = tiny_run("cpu", reconstruction=rc)
    cuda = tiny_run("auto", reconstruction=rc)
    assert [b.status for b in cuda.blocks] == [b.status for b in cpu.blocks]
    pairs = [(b.loss_before, c.loss_before) for b, c in zip(cuda.blocks, cpu.blocks, strict=True) if b.loss_before]
    assert pairs
    np.testing.assert_allclose(*np.array(pairs).T, rtol=1e-5)
