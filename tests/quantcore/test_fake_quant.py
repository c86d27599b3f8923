"""The torch fake-quant kernels against the numpy reference, ml_dtypes, torch's float8 casts and ONNX
Runtime's QuantizeLinear → DequantizeLinear."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from quantcore.numerics.fake_quant import fake_quantize_numpy, fake_quantize_tensor, quantize_array
from quantcore.numerics.floating import E4M3FN, E5M2, FloatFormat, round_to_format
from quantcore.numerics.policy import QuantPolicy, RoundingPolicy, make_policy
from quantcore.numerics.rounding import round_values
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from tests.quantcore.reference import MODES, float_round_reference, linear_reference, round_reference

P = QuantPolicy
FORMAT_LAYOUT = {E4M3FN: (4, 3, True), E5M2: (5, 2, False)}  # (E, M, finite_only_top) for the reference


def test_rounding_modes_on_the_docstring_table() -> None:
    v = torch.tensor([2.5, 3.5, -2.5, -3.5, 2.4, -2.6, 0.49999997, 0.5, -0.5])
    expected = {
        "half_even": [2, 4, -2, -4, 2, -3, 0, 0, 0],
        "half_up": [3, 4, -2, -3, 2, -3, 0, 1, 0],
        "half_down": [2, 3, -3, -4, 2, -3, 0, 0, -1],
        "half_towards_zero": [2, 3, -2, -3, 2, -3, 0, 0, 0],
        "half_away_from_zero": [3, 4, -3, -4, 2, -3, 0, 1, -1],
        "ceil": [3, 4, -2, -3, 3, -2, 1, 1, 0],
        "floor": [2, 3, -3, -4, 2, -3, 0, 0, -1],
    }
    for mode, values in expected.items():
        assert round_values(v, RoundingPolicy(mode)).tolist() == values, mode
        np.testing.assert_array_equal(round_reference(v.numpy(), mode), values)  # the reference agrees


# ---- linear kernel vs the numpy reference -------------------------------------------------------


@st.composite
def linear_cases(draw: st.DrawFn) -> tuple[np.ndarray, TensorQuantConfig]:
    """A tensor (3-D, channels on axis 1) and a calibrated config of any policy, bit width, rounding."""
    num_bits = draw(st.integers(2, 16))
    symmetric, per_channel, power_of_2 = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    rounding = draw(st.sampled_from(list(RoundingPolicy)))
    channels = draw(st.integers(1, 4))
    shape = (draw(st.integers(1, 3)), channels, draw(st.integers(1, 6)))
    n_scales = channels if per_channel else 1
    exponents = draw(hnp.arrays(np.int32, n_scales, elements=st.integers(-12, 4)))
    mantissas = draw(hnp.arrays(np.float32, n_scales, elements=st.floats(1.0, 2.0, width=32, exclude_max=True)))
    scale = np.ldexp(mantissas, exponents).astype(np.float32)
    if power_of_2:  # a POWER_OF_2 config holds power-of-two scales (rounded up, as scale_offset does)
        scale = np.ldexp(np.float32(1.0), exponents + 1).astype(np.float32)
    if draw(st.booleans()):  # values on the half-grid: exact ties for every rounding mode
        steps = draw(hnp.arrays(np.int32, shape, elements=st.integers(-(2**17), 2**17)))
        s_b = scale.reshape(1, -1, 1) if per_channel else scale
        x = (steps.astype(np.float64) * 0.5 * s_b).astype(np.float32)
    else:
        x = draw(hnp.arrays(np.float32, shape, elements=st.floats(-1e4, 1e4, width=32)))
    policy = make_policy(symmetric=symmetric, per_channel=per_channel, power_of_2=power_of_2)
    tqc = TensorQuantConfig(
        num_bits=num_bits, policy=policy, channel_axis=1 if per_channel else None, rounding=rounding
    )
    offset = None
    if not symmetric:
        offset = draw(hnp.arrays(np.int32, n_scales, elements=st.integers(tqc.quant_min, tqc.quant_max)))
    scalar = lambda a: a if per_channel else a[0]  # noqa: E731
    tqc = tqc.with_scale(scalar(scale), None if offset is None else scalar(offset))
    return x, tqc


@settings(max_examples=600, deadline=None)
@given(case=linear_cases())
def test_linear_kernel_equals_the_reference_for_every_policy_and_rounding(case) -> None:
    x, tqc = case
    scale = np.asarray(tqc.scale)
    axis = 1 if tqc.per_channel else None
    codes, expected = linear_reference(x, scale, tqc.offset, tqc.quant_min, tqc.quant_max, axis, tqc.rounding.value)
    # Bit-exact: both divide x / s once in float32 and multiply (q - o) · s once, exactly rounded.
    np.testing.assert_array_equal(fake_quantize_numpy(x, tqc), expected)
    np.testing.assert_array_equal(quantize_array(x, tqc).astype(np.float64), codes)


def test_nan_is_preserved_and_inf_saturates() -> None:
    tqc = TensorQuantConfig(scale=0.5, state=QuantState.ACTIVATED)
    out = fake_quantize_numpy(np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32), tqc)
    assert np.isnan(out[0]) and out[1:].tolist() == [63.5, -64.0, 1.0]


def test_dynamic_policy_scales_each_value_by_its_own_range() -> None:
    x = np.array([[-1.0, 0.0, 3.0], [0.5, 2.0, 1.0]], dtype=np.float32)
    tqc = TensorQuantConfig(policy=P.PER_TENSOR | P.LINEAR | P.ASYMMETRIC | P.DYNAMIC)
    scale = 4.0 / 255  # range [-1, 3] of this value
    _, expected = linear_reference(x, np.float32(scale), np.round(1 / np.float32(scale)), 0, 255, None)
    np.testing.assert_array_equal(fake_quantize_numpy(x, tqc), expected)


# ---- FP8 ---------------------------------------------------------------------------------------


def every_half() -> np.ndarray:
    """All finite float16 values as float32: every FP8 value, every tie and both sides of each, and
    the subnormal and overflow regions of both formats."""
    values = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    return values[np.isfinite(values)]


@pytest.mark.parametrize("fmt", [E4M3FN, E5M2])
@pytest.mark.parametrize("mode", MODES)
def test_fp8_rounding_equals_the_table_reference_on_every_half(fmt: FloatFormat, mode: str) -> None:
    v = every_half() * (64.0 if fmt is E5M2 else 1.0)  # reach E5M2's max (57344 > float16's 65504 / 2)
    e, m, finite_top = FORMAT_LAYOUT[fmt]
    actual = round_to_format(torch.from_numpy(v), fmt, rounding=RoundingPolicy(mode)).numpy()
    expected = float_round_reference(v, e, m, finite_only_top=finite_top, mode=mode)
    np.testing.assert_array_equal(actual, expected)  # exact: both are points of the same grid


@pytest.mark.parametrize(("fmt", "dtype"), [(E4M3FN, ml_dtypes.float8_e4m3fn), (E5M2, ml_dtypes.float8_e5m2)])
def test_fp8_plain_cast_equals_ml_dtypes(fmt: FloatFormat, dtype: type) -> None:
    v = np.concatenate([every_half(), every_half() * 64.0, [np.inf, -np.inf, np.nan]]).astype(np.float32)
    actual = round_to_format(torch.from_numpy(v), fmt, saturate=False).numpy()
    expected = v.astype(dtype).astype(np.float32)  # ml_dtypes: non-saturating, round-half-even
    np.testing.assert_array_equal(actual, expected)  # NaN positions compared too (array_equal: nan == nan)


def test_fp8_matches_torch_native_casts_where_the_semantics_match() -> None:
    v = torch.from_numpy(np.concatenate([every_half(), every_half() * 64.0]))
    # E4M3FN within its range (torch's casts beyond ±448 differ by version: torch 2.13 saturates as ONNX's
    # saturate=1 does, torch 2.11 gives NaN; the saturation is checked against ONNX Runtime's QDQ below)
    inside = v[v.abs() <= 448]
    torch.testing.assert_close(round_to_format(inside, E4M3FN), inside.to(torch.float8_e4m3fn).float(), rtol=0, atol=0)
    # E5M2 overflows to inf in torch (a plain IEEE cast), as round_to_format without saturation
    torch.testing.assert_close(
        round_to_format(v, E5M2, saturate=False), v.to(torch.float8_e5m2).float(), rtol=0, atol=0, equal_nan=True
    )


@settings(max_examples=300, deadline=None)
@given(
    x=hnp.arrays(np.float32, (4, 3), elements=st.floats(-1e6, 1e6, width=32)),
    scales=hnp.arrays(np.float32, 3, elements=st.floats(2.0**-13, 1024.0, width=32)),
    exponent_bits=st.sampled_from([4, 5]),
    per_channel=st.booleans(),
    mode=st.sampled_from(MODES),
    lowered=st.booleans(),
)
def test_fp8_fake_quant_equals_the_reference(x, scales, exponent_bits, per_channel, mode, lowered) -> None:
    fmt = {4: E4M3FN, 5: E5M2}[exponent_bits]
    quant_max = {4: 240.0, 5: 24576.0}[exponent_bits] if lowered else fmt.max
    policy = make_policy(floating=True, per_channel=per_channel)
    scale = scales if per_channel else scales[0]
    tqc = TensorQuantConfig(
        policy=policy,
        exponent_bits=exponent_bits,
        channel_axis=1 if per_channel else None,
        quant_max=quant_max,
        rounding=RoundingPolicy(mode),
        scale=scale,
        state=QuantState.ACTIVATED,
    )
    v = x / np.asarray(scale, dtype=np.float32)  # float32 division, as the kernel
    e, m, finite_top = FORMAT_LAYOUT[fmt]
    expected = (
        float_round_reference(v, e, m, finite_only_top=finite_top, mode=mode, quant_max=quant_max)
        * np.asarray(scale, dtype=np.float64)
    ).astype(np.float32)
    # Exact: an FP8 value times a float32 scale is one float32 rounding in both.
    np.testing.assert_array_equal(fake_quantize_numpy(x, tqc), expected)
    np.testing.assert_array_equal(
        quantize_array(x, tqc),
        float_round_reference(v, e, m, finite_only_top=finite_top, mode=mode, quant_max=quant_max).astype(np.float32),
    )


def test_fp8_subnormals_underflow_gradually() -> None:
    tiny = torch.tensor([2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-7 + 2.0**-9, 2.0**-11])
    # E4M3FN: subnormal step 2^-9; 2^-10 is a tie between 0 and 2^-9 → even (0); 3·2^-10 → 2·2^-9
    assert round_to_format(tiny, E4M3FN).tolist() == [2.0**-9, 0.0, 2.0**-8, 2.0**-7 + 2.0**-9, 0.0]


# ---- gradients ---------------------------------------------------------------------------------


def test_linear_ste_and_lsq_gradients() -> None:
    rng = np.random.default_rng(0)
    x_np = rng.normal(scale=3.0, size=(64,)).astype(np.float32)
    tqc = TensorQuantConfig(num_bits=4, scale=0.25, state=QuantState.ACTIVATED)  # range [-2, 1.75]
    x = torch.tensor(x_np, requires_grad=True)
    scale = torch.tensor(0.25, requires_grad=True)
    fake_quantize_tensor(x, tqc, scale=scale).sum().backward()
    v = x_np / np.float32(0.25)
    codes = round_reference(v, "half_even")
    inside = (codes >= -8) & (codes <= 7)
    assert 0 < inside.sum() < len(x_np)  # both regions exercised
    np.testing.assert_array_equal(x.grad.numpy(), inside.astype(np.float32))  # STE: 1 inside, 0 clipped
    # LSQ: d x̂/ds = round(v) - v inside, the clipped code outside. float32 sums: 1e-5 relative.
    lsq = np.where(inside, codes - v, np.clip(codes, -8, 7)).sum()
    np.testing.assert_allclose(scale.grad.item(), lsq, rtol=1e-5)

    scale.grad = None
    fake_quantize_tensor(x.detach(), tqc, scale=scale, grad_scale=0.1).sum().backward()
    np.testing.assert_allclose(scale.grad.item(), 0.1 * lsq, rtol=1e-5)  # forward unchanged, gradient scaled


def test_fp8_ste_gradients() -> None:
    x = torch.tensor([1.0, -3.3, 500.0, -1e4, 0.01], requires_grad=True)
    tqc = TensorQuantConfig(policy=make_policy(floating=True), scale=1.0, state=QuantState.ACTIVATED)
    out = fake_quantize_tensor(x, tqc)
    out.sum().backward()
    assert out.tolist()[2:4] == [448.0, -448.0]
    assert x.grad.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]  # zero only where saturated


def test_power_of_2_learned_scale_is_rounded_up_with_a_straight_through_gradient() -> None:
    tqc = TensorQuantConfig(policy=make_policy(power_of_2=True), scale=0.5, state=QuantState.ACTIVATED)
    scale = torch.tensor(0.3, requires_grad=True)  # a learned scale, between powers of two
    out = fake_quantize_tensor(torch.tensor([1.0, 0.7]), tqc, scale=scale)
    assert out.tolist() == [1.0, 0.5]  # scale 0.5: 1.0 → 2 · 0.5, 0.7 → 1 · 0.5 (1.4 rounds to 1)
    out.sum().backward()
    assert scale.grad is not None and torch.isfinite(scale.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernels_run_on_cuda_and_match_cpu() -> None:
    x = torch.randn(1000) * 10
    for tqc in (
        TensorQuantConfig(scale=0.1, state=QuantState.ACTIVATED),
        TensorQuantConfig(policy=make_policy(floating=True), scale=0.01, state=QuantState.ACTIVATED),
    ):
        torch.testing.assert_close(fake_quantize_tensor(x.cuda(), tqc).cpu(), fake_quantize_tensor(x, tqc))


# ---- ONNX Runtime ------------------------------------------------------------------------------


def qdq_model(
    scale: np.ndarray, zero_point: np.ndarray, axis: int | None, shape: tuple[int, ...], zp_type: int, opset: int
) -> bytes:
    """x → QuantizeLinear → DequantizeLinear → y, scale and zero point as initializers."""
    attrs = {} if axis is None else {"axis": axis}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], **attrs),
    ]
    initializers = [
        helper.make_tensor("s", TensorProto.FLOAT, scale.shape, scale.ravel().tolist()),
        helper.make_tensor("zp", zp_type, zero_point.shape, zero_point.ravel().tolist()),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # onnx 1.23 stamps an IR version that ONNX Runtime 1.31 refuses
    onnx.checker.check_model(model)
    return model.SerializeToString()


def run(model: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(np.float32, (2, 3, 5), elements=st.floats(-50, 50, width=32)),
    scales=hnp.arrays(np.float32, 3, elements=st.floats(2.0**-10, 1.0, width=32)),
    per_channel=st.booleans(),
    symmetric=st.booleans(),
)
def test_linear_kernel_equals_onnxruntime_qdq(x, scales, per_channel, symmetric) -> None:
    policy = make_policy(per_channel=per_channel, symmetric=symmetric)
    scale = scales if per_channel else scales[0]
    offset = None if symmetric else np.full(np.shape(scale), 100, dtype=np.int32)
    tqc = TensorQuantConfig(
        policy=policy, channel_axis=1 if per_channel else None, scale=scale, offset=offset, state=QuantState.ACTIVATED
    )
    zp_type = TensorProto.INT8 if symmetric else TensorProto.UINT8
    model = qdq_model(np.asarray(tqc.scale), np.asarray(tqc.offset), 1 if per_channel else None, x.shape, zp_type, 13)
    # Exact: ONNX Runtime's CPU kernel computes round_half_even(x / s) in float32 like ours.
    np.testing.assert_array_equal(fake_quantize_numpy(x, tqc), run(model, x))


@pytest.mark.parametrize(("exponent_bits", "zp_type"), [(4, TensorProto.FLOAT8E4M3FN), (5, TensorProto.FLOAT8E5M2)])
def test_fp8_kernel_equals_onnxruntime_qdq(exponent_bits: int, zp_type: int) -> None:
    x = np.concatenate([every_half(), every_half() * 64.0])[::7].astype(np.float32)
    x = x[np.abs(x) < 4e5]  # ONNX Runtime's saturating cast: keep values within a 2x of the max
    tqc = TensorQuantConfig(
        policy=make_policy(floating=True), exponent_bits=exponent_bits, scale=0.5, state=QuantState.ACTIVATED
    )
    model = qdq_model(np.asarray(np.float32(0.5)), np.asarray(0.0), None, x.shape, zp_type, 19)
    np.testing.assert_array_equal(fake_quantize_numpy(x, tqc), run(model, x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_input_dtypes_are_quantized_in_float32_or_wider_and_returned_in_their_own(dtype) -> None:
    x = torch.linspace(-3, 3, 97, dtype=dtype)
    tqc = TensorQuantConfig(scale=0.05, state=QuantState.ACTIVATED)
    out = fake_quantize_tensor(x, tqc)
    assert out.dtype == dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    expected = fake_quantize_tensor(x.to(compute), tqc).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # same codes; one final rounding to dtype
