"""Tiny ONNX models built with onnx.helper, for tests that need a valid model but no training."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tiny_conv_model(*, opset: int = 17, input_name: str = "image") -> onnx.ModelProto:
    """image (N,3,8,8) → Conv 3→4 3x3 → Relu → GlobalAveragePool → Flatten → Gemm 4→2 → logits."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "conv.weight")
    bias = numpy_helper.from_array(np.zeros(4, np.float32), "conv.bias")
    fc_w = numpy_helper.from_array(rng.normal(size=(2, 4)).astype(np.float32), "fc.weight")
    fc_b = numpy_helper.from_array(np.zeros(2, np.float32), "fc.bias")
    nodes = [
        helper.make_node("Conv", [input_name, "conv.weight", "conv.bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [weight, bias, fc_w, fc_b],
    )
    # IR 10 (ONNX 1.16): what ONNX Runtime of this era loads; onnx.helper would stamp its newest.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def tiny_conv_bytes(**kwargs) -> bytes:
    return tiny_conv_model(**kwargs).SerializeToString()
