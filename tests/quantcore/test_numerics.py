"""The exported QDQ model computes what fake quantization says it should.

The reference below is an independent numpy implementation (it shares no code with quantcore):
ONNX QuantizeLinear semantics, q = clip(round_half_even(x / s), -128, 127), x̂ = q · s, applied to the
input and the activation before the Gemm, per-channel to the weights, and a direct convolution.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import torch
from onnx import numpy_helper

from quantcore import QuantizeConfig, annotate, calibrate, export, prepare
from quantcore.numerics.fake_quant import fake_quantize
from tests.quantcore.models import conv_relu_gemm


def fake_quant(x: np.ndarray, scale: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Reference fake-quant in float32 like ONNX Runtime: x / s rounded half to even, clipped."""
    s = np.asarray(scale, dtype=np.float32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    q = np.clip(np.round(x.astype(np.float32) / s), -128, 127)
    return (q * s).astype(np.float32)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Valid convolution, stride 1: (N, C, H, W) * (O, C, k, k) → (N, O, H-k+1, W-k+1), float64."""
    k = w.shape[-1]
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (k, k), axis=(2, 3))  # (N,C,H',W',k,k)
    return np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64)) + b[None, :, None, None]


def test_exact_qdq_matches_numpy_fake_quant_within_one_step(tmp_path) -> None:
    model = conv_relu_gemm(seed=4)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rng = np.random.default_rng(5)
    calibration = rng.normal(size=(32, 2, 6, 6)).astype(np.float32)
    evaluation = rng.normal(size=(64, 2, 6, 6)).astype(np.float32)

    config = QuantizeConfig(observer="minmax", batch_size=10)
    prepared = prepare(model)
    annotation = calibrate(prepared, annotate(prepared, config), {"input": calibration}, config)
    exported = export(prepared, annotation, tmp_path)
    table = json.loads(exported.tqc_path.read_text())["tensors"]

    # Scales, derived independently: amax / 127 over the calibration data (FP32 activations) and
    # per output channel for weights. float32 scales vs float64 maths: 1e-6 relative.
    relu_fp32 = np.maximum(conv2d(calibration, weights["w"], weights["b"]), 0.0)
    s_in = np.abs(calibration).max() / 127
    s_flat = np.abs(relu_fp32).max() / 127
    s_w = np.abs(weights["w"]).reshape(3, -1).max(axis=1) / 127
    s_fc = np.abs(weights["fc.w"]).max(axis=1) / 127
    np.testing.assert_allclose(table["input"]["scale"], s_in, rtol=1e-6)
    np.testing.assert_allclose(table["flat"]["scale"], s_flat, rtol=1e-6)
    np.testing.assert_allclose(table["w"]["scale"], s_w, rtol=1e-6)
    np.testing.assert_allclose(table["fc.w"]["scale"], s_fc, rtol=1e-6)

    # Reference forward pass with the exported scales.
    s_in, s_flat = np.float32(table["input"]["scale"]), np.float32(table["flat"]["scale"])
    w_hat = fake_quant(weights["w"], np.array(table["w"]["scale"]), axis=0)
    fc_hat = fake_quant(weights["fc.w"], np.array(table["fc.w"]["scale"]), axis=0)
    relu = np.maximum(conv2d(fake_quant(evaluation, s_in), w_hat, weights["b"]), 0.0)
    flat_hat = fake_quant(relu.reshape(len(evaluation), -1).astype(np.float32), s_flat).astype(np.float64)
    expected = flat_hat @ fc_hat.T.astype(np.float64) + weights["fc.b"]

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(str(exported.model_path), options, providers=["CPUExecutionProvider"])
    actual = session.run(None, {"input": evaluation})[0]

    # Tolerance: one quantization step of the Gemm input. ONNX Runtime accumulates the Conv in
    # float32 in another order than this float64 reference, so a pre-activation lying within
    # rounding error of a code boundary may round to the neighbouring code; one such flip moves an
    # output by at most s_flat · max|ŵ_fc|. Everything else agrees to float32 accumulation error.
    one_step = float(s_flat) * float(np.abs(fc_hat).max())
    error = np.abs(actual - expected)
    assert error.max() <= one_step + 1e-5
    assert np.mean(error <= 1e-4) >= 0.95  # flips are rare: nearly all outputs match to float error


def test_torch_kernel_matches_the_reference_and_passes_gradients_inside_the_range() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3, 4, 5)).astype(np.float32) * 2  # |x| up to ~6 > 127 · 0.01
    scale = np.array([0.01, 0.02, 0.015, 0.03], dtype=np.float32)
    expected = fake_quant(x, scale, axis=1)
    tensor = torch.tensor(x, requires_grad=True)
    actual = fake_quantize(tensor, torch.tensor(scale), torch.zeros(4, dtype=torch.int32), -128, 127, axis=1)
    np.testing.assert_allclose(actual.detach().numpy(), expected, rtol=0, atol=1e-7)  # same float32 ops
    actual.sum().backward()
    codes = np.round(x / scale.reshape(1, 4, 1))
    inside = (codes >= -128) & (codes <= 127)
    assert not inside.all()  # the data does reach the clipped region
    np.testing.assert_array_equal(tensor.grad.numpy(), inside.astype(np.float32))  # STE: 1 inside, 0 clipped
