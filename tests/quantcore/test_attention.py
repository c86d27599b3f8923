"""Attention over long sequences (quantcore.prepare.attention): integer presets keep the probabilities' product
float beyond LONG_ATTENTION positions, measured on the sample where shapes are symbolic; FP8 keeps it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantcore import QuantizeConfig, annotate, prepare, quantize
from quantcore.prepare.attention import LONG_ATTENTION, attention_products, softmax_positions
from tests.quantcore.models import masked_attention, padded_tokens, save


def attention(width: int = 16, sharpness: float = 2.0, seed: int = 0) -> onnx.ModelProto:
    """x (N, T, width) → q, k, v = x·W → Softmax(sharpness · q·kᵀ / √width) over T → p·v (N, T, width) = out.
    Node names: "q", "k", "v", "kt", "scores", "scale", "softmax", "context"."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32), f"W{n}")
        for n in "qkv"
    ]
    inits.append(numpy_helper.from_array(np.array(sharpness / np.sqrt(width), np.float32), "factor"))
    nodes = [helper.make_node("MatMul", ["x", f"W{n}"], [n], name=n) for n in "qkv"]
    nodes += [
        helper.make_node("Transpose", ["k"], ["k_t"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "k_t"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "factor"], ["s_scaled"], name="scale"),
        helper.make_node("Softmax", ["s_scaled"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"], name="context"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "T", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_products_of_attention_probabilities_are_found_behind_reshapes() -> None:
    model = attention()
    assert {name: s.name for name, s in attention_products(model.graph).items()} == {"context": "softmax"}
    # heads split by Reshape and Transpose between the Softmax and its product: still found
    graph = model.graph
    graph.node[-1].input[0] = "p_heads"
    graph.node.insert(
        len(graph.node) - 1, helper.make_node("Transpose", ["p"], ["p_heads"], name="heads", perm=[0, 1, 2])
    )
    assert list(attention_products(graph)) == ["context"]


@pytest.mark.parametrize(
    ("opset", "axis", "shape", "positions"),
    [(17, None, (2, 3, 40), 40), (17, 1, (2, 3, 40), 3), (11, None, (2, 3, 40), 120), (11, 2, (2, 3, 40), 40)],
)
def test_softmax_positions_follow_the_axis_of_each_opset(opset, axis, shape, positions) -> None:
    """From opset 13 a Softmax normalises along its axis (default -1); before, over every axis from its
    axis on (default 1), as one flattened distribution."""
    attributes = {} if axis is None else {"axis": axis}
    node = helper.make_node("Softmax", ["s"], ["p"], **attributes)
    assert softmax_positions(node, shape, opset) == positions


def test_positions_are_measured_on_the_sample_where_shapes_are_symbolic() -> None:
    """masked_attention's sequence axis is symbolic, and inference cannot fix it: without a sample the
    positions are unknown (and the product is quantized as before); with one, they are measured."""
    assert prepare(masked_attention()).attention_positions == {}
    sample = padded_tokens(4, 200, 8)
    assert prepare(masked_attention(), sample=sample).attention_positions == {"context": 200}


@pytest.mark.parametrize(
    ("platform", "tokens", "quantized"),
    [
        ("tensorrt", 200, False),
        ("onnxruntime", 200, False),
        ("academic", 200, False),
        ("tensorrt-fp8", 200, True),  # FP8's steps are relative: small probabilities survive
        ("tensorrt", LONG_ATTENTION, True),
        ("onnxruntime", LONG_ATTENTION, True),
    ],
)
def test_integer_presets_keep_long_attention_float(platform: str, tokens: int, quantized: bool) -> None:
    prepared = prepare(masked_attention(), sample=padded_tokens(4, tokens, 8))
    annotation = annotate(prepared, QuantizeConfig(platform=platform))
    assert ("p" in annotation.configs) is quantized
    assert (annotation.decisions["context"] == "quantized") is quantized
    if not quantized:
        assert f"over {tokens} positions" in annotation.reasons["context"]
    # the scores' product and the projections are the platform's as before
    assert annotation.decisions["scores"] == "quantized"


def test_long_attention_quantizes_close_to_fp32(tmp_path) -> None:
    """One attention over 400 positions whose output is its context p·v: with the product kept float, the
    integer presets' exact Q/DQ models keep the error of their int8 projections."""
    path = save(attention(), tmp_path / "attention.onnx")
    data = np.random.default_rng(1).normal(size=(24, 400, 16)).astype(np.float32)
    for platform in ("tensorrt", "onnxruntime", "academic"):
        config = QuantizeConfig(platform=platform, cpu_latency=False, batch_size=8)
        report = quantize(path, {"x": data[:16]}, {"x": data[16:]}, config, tmp_path / platform).report
        sqnr = report["evaluation"]["qdq_exact"]["outputs"]["out"]["sqnr_db"]
        # measured 32.5 (tensorrt), 32.0 (onnxruntime), 32.1 dB (academic); with the probabilities
        # quantized (LONG_ATTENTION set past 400) 16.6, 16.9 and 16.9 dB: 25 dB tells the two apart
        assert sqnr > 25.0, (platform, sqnr)
