"""Tiny ONNX models built with onnx.helper, for tests and benchmarks that need a valid model but no training."""

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


def stateful_model(state_size: int = 8) -> onnx.ModelProto:
    """x (B, 16), state (2, B, S), sr scalar → h = x·W1 (B, S); m = (h + mean over axis 0 of state) · sr;
    y = m·W2 (B, 4); state_out = state + m (2, B, S): a recurrent cell's inputs, samples on axis 1 of the
    state and no sample axis at all on the scalar (as Silero VAD declares them). Each sample's outputs
    depend on that sample's x and state only."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.3, (16, state_size)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 0.3, (state_size, 4)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="proj"),
        helper.make_node("ReduceMean", ["state", "axis0"], ["s"], name="mean", keepdims=0),
        helper.make_node("Add", ["h", "s"], ["hs"], name="join"),
        helper.make_node("Mul", ["hs", "sr"], ["m"], name="rate"),
        helper.make_node("MatMul", ["m", "W2"], ["y"], name="head"),
        helper.make_node("Add", ["state", "m"], ["state_out"], name="update"),
    ]
    float32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "stateful",
        [
            helper.make_tensor_value_info("x", float32, ["batch", 16]),
            helper.make_tensor_value_info("state", float32, [2, "batch", state_size]),
            helper.make_tensor_value_info("sr", float32, []),
        ],
        [
            helper.make_tensor_value_info("y", float32, ["batch", 4]),
            helper.make_tensor_value_info("state_out", float32, [2, "batch", state_size]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def stateful_data(samples: int, seed: int, state_size: int = 8) -> dict[str, np.ndarray]:
    """Inputs of ``stateful_model``: samples on axis 0 of x and axis 1 of state, one scalar sr."""
    rng = np.random.default_rng(seed)
    scales = np.linspace(0.1, 10, samples)[None, :, None]
    return {
        "x": rng.normal(size=(samples, 16)).astype(np.float32),
        # per-sample states of very different sizes, so that a state sliced on the wrong axis shows
        "state": (rng.normal(size=(2, samples, state_size)) * scales).astype(np.float32),
        "sr": np.array(0.5, np.float32),
    }
