"""The torch forms of ONNX ops that reconstruction blocks run (``torch_ops``), checked against ONNX
Runtime on one node, and a block holding such an op reconstructed end to end."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from quantcore import QuantizeConfig, ReconstructionConfig, annotate, calibrate, prepare, reconstruct
from quantcore.reconstruction.torch_ops import OPS
from quantcore.runtime.session import open_session

CONV_TRANSPOSE_CASES = {
    "plain": {},
    "stride 2, symmetric pads": {"strides": [2, 2], "pads": [1, 1, 1, 1]},
    "asymmetric pads, output_padding": {"strides": [2, 2], "pads": [0, 1, 1, 0], "output_padding": [1, 1]},
    "dilated, grouped": {"dilations": [2, 1], "group": 2},
    "output_shape": {"strides": [2, 2], "output_shape": [11, 12]},
    "SAME_UPPER": {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    "SAME_LOWER": {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
}


@pytest.mark.parametrize("attrs", CONV_TRANSPOSE_CASES.values(), ids=CONV_TRANSPOSE_CASES.keys())
def test_conv_transpose_matches_onnx_runtime(attrs) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)  # (C_in, C_out/group, kH, kW)
    b = rng.standard_normal(3 * attrs.get("group", 1)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "convtranspose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    with open_session(model) as session:
        expected = session.run(None, {"x": x})[0]
    (actual,) = OPS["ConvTranspose"]([torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)], attrs)
    assert actual.shape == expected.shape
    # float32 sums in a different order: 1e-5 relative to values of order 10
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_a_conv_transpose_block_is_reconstructed(tmp_path) -> None:
    # x (N,2,6,6) → Conv → Relu → ConvTranspose (stride 2) → Relu → GlobalAveragePool → Flatten → Gemm
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("ConvTranspose", ["r0", "wt", "bt"], ["u"], name="up", strides=[2, 2], pads=[1, 1, 0, 0]),
        helper.make_node("Relu", ["u"], ["r1"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["r1"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wh"], ["logits"], name="head", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "up",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [init("w0", 8, 2, 3, 3), init("wt", 8, 6, 3, 3), init("bt", 6), init("wh", 3, 6)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "up.onnx"
    onnx.save(model, str(path))
    base = QuantizeConfig(platform="academic", precision="w4a8", observer="minmax", cpu_latency=False)
    data = {"x": rng.uniform(-1, 1, (64, 2, 6, 6)).astype(np.float32)}
    prepared = prepare(path)
    annotation = calibrate(prepared, annotate(prepared, base), data, base)
    config = QuantizeConfig(
        platform="academic",
        precision="w4a8",
        observer="minmax",
        cpu_latency=False,
        reconstruction=ReconstructionConfig(method="adaround", iters=200, batch_size=16, num_samples=64, threads=1),
    )
    result = reconstruct(prepared, annotation, data, config)
    up = next(b for b in result.blocks if "up" in b.nodes)
    assert up.status == "reconstructed" and up.warning is None
    assert up.loss_after < up.loss_before
