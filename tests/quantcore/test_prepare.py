"""prepare: BN folding (structure and numerics), constant folding, opset upgrade, names kept."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from quantcore import QuantizeConfig, UnsupportedModelError, annotate, prepare
from quantcore.errors import InvalidModelError
from tests.quantcore.models import conv_bn_residual, conv_relu_gemm, gemm_bn, save


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_close_relative(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    # Relative to the output's magnitude, not per element: folding reorders float32 arithmetic, so
    # each element may move by a few ulps of the largest values it was computed from.
    scale = float(np.abs(expected).max())
    assert float(np.abs(actual - expected).max()) <= rtol * scale


def test_batchnorm_is_folded_and_names_are_kept(tmp_path) -> None:
    prepared = prepare(save(conv_bn_residual(), tmp_path / "m.onnx"))
    ops = [n.op_type for n in prepared.model.graph.node]
    assert "BatchNormalization" not in ops
    assert {(f.node, f.batchnorm) for f in prepared.folded_batchnorms} == {("conv1", "bn1"), ("conv2", "bn2")}
    graph = prepared.model.graph
    assert [i.name for i in graph.input] == ["input"] and [o.name for o in graph.output] == ["logits"]
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    # the folded Conv now produces the BN's output name, so downstream names are unchanged
    producers = {o: n.name for n in graph.node for o in n.output}
    assert producers["b1"] == "conv1" and producers["b2"] == "conv2"
    # bn params are gone; conv2 (no bias before) gained one
    names = {t.name for t in graph.initializer}
    assert not any(n.startswith(("bn1.", "bn2.")) for n in names)
    assert len(next(n for n in graph.node if n.name == "conv2").input) == 3


def test_batchnorm_folding_matches_unfolded_model(tmp_path) -> None:
    model = conv_bn_residual(seed=3)
    prepared = prepare(save(model, tmp_path / "m.onnx"))
    x = np.random.default_rng(0).normal(size=(5, 3, 8, 8)).astype(np.float32)
    (expected,) = run(model, {"input": x})
    (actual,) = run(prepared.model, {"input": x})
    assert_close_relative(actual, expected, rtol=1e-5)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_batchnorm_folding_matches(trans_b: int) -> None:
    model = gemm_bn(transB=trans_b)
    prepared = prepare(model)
    assert [n.op_type for n in prepared.model.graph.node] == ["Gemm"]
    x = np.random.default_rng(1).normal(size=(7, 6)).astype(np.float32)
    (expected,) = run(model, {"input": x})
    (actual,) = run(prepared.model, {"input": x})
    assert_close_relative(actual, expected, rtol=1e-5)


def test_batchnorm_with_a_second_consumer_of_the_conv_output_is_kept() -> None:
    model = conv_bn_residual()
    # conv1's output "c1" also becomes a graph output: folding would change its value, so no fold
    model.graph.output.append(helper.make_tensor_value_info("c1", onnx.TensorProto.FLOAT, None))
    prepared = prepare(model)
    assert [f.batchnorm for f in prepared.folded_batchnorms] == ["bn2"]
    assert sum(n.op_type == "BatchNormalization" for n in prepared.model.graph.node) == 1


def test_constants_fed_through_identity_are_folded() -> None:
    model = conv_bn_residual()
    graph = model.graph
    # the TorchScript exporter's idiom: parameters reach the BN through Identity nodes
    identity = helper.make_node("Identity", ["bn1.mean"], ["bn1.mean_copy"], name="copy_mean")
    graph.node.insert(0, identity)
    bn1 = next(n for n in graph.node if n.name == "bn1")
    bn1.input[3] = "bn1.mean_copy"
    prepared = prepare(model)
    assert prepared.folded_constants == 1
    assert "Identity" not in [n.op_type for n in prepared.model.graph.node]
    assert {f.batchnorm for f in prepared.folded_batchnorms} == {"bn1", "bn2"}


def test_old_opset_is_upgraded_to_13(tmp_path) -> None:
    model = conv_relu_gemm()
    model.opset_import[0].version = 11
    prepared = prepare(save(model, tmp_path / "m.onnx"))
    assert prepared.source_opset == 11 and prepared.opset == 13
    assert any("opset upgraded" in w for w in prepared.warnings)
    x = np.random.default_rng(0).normal(size=(2, 2, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(run(prepared.model, {"input": x})[0], run(model, {"input": x})[0], rtol=1e-6)


def test_failed_opset_conversion_is_unsupported() -> None:
    model = conv_relu_gemm()
    model.opset_import[0].version = 11
    model.graph.node[0].attribute.append(helper.make_attribute("bogus", 1))
    with pytest.raises(UnsupportedModelError, match=r"opset 11.*conversion failed"):
        prepare(model)


def test_already_quantized_model_is_unsupported() -> None:
    model = conv_relu_gemm()
    graph = model.graph
    graph.initializer.extend([numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z")])
    graph.node.insert(0, helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"], name="q"))
    graph.node.insert(1, helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"], name="dq"))
    graph.node[2].input[0] = "dq"
    with pytest.raises(UnsupportedModelError, match="already quantized"):
        prepare(model)


def test_unnamed_nodes_get_unique_names_and_tensors_keep_theirs() -> None:
    model = conv_relu_gemm()
    for node in model.graph.node:
        node.name = ""
    prepared = prepare(model)
    names = [n.name for n in prepared.model.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert [n.output[0] for n in prepared.model.graph.node] == ["conv", "relu", "flat", "out"]


def test_garbage_file_is_an_invalid_model(tmp_path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\xff\xfe not a protobuf at all \x00\x01")
    with pytest.raises(InvalidModelError):
        prepare(path)


def test_ir_version_is_lowered_only_as_far_as_the_opset_allows() -> None:
    from quantcore.prepare.opset import MAX_RUNTIME_IR_VERSION, lower_ir_version, required_ir_version

    model = conv_relu_gemm()
    model.ir_version = 14
    assert required_ir_version(model) <= 8  # opset 17 came with IR 8 (onnx 1.12)
    assert lower_ir_version(model) == 14 and model.ir_version == MAX_RUNTIME_IR_VERSION
    assert lower_ir_version(model) is None  # already loadable: unchanged
    model.opset_import[0].version = 28  # an opset newer than the runtime's IR can carry
    model.ir_version = 14
    assert lower_ir_version(model) is None and model.ir_version == 14


def hard_swish_convs() -> onnx.ModelProto:
    """input (N, 3, 8, 8) → conv1 → x · clip(x + 3, 0, 6) / 6 (written out, as PaddleOCR's models) → conv2 → out;
    a second Div by a divisor that holds a 0 stays a Div."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
        numpy_helper.from_array(np.array([1.0, 0.0, 2.0, 4.0], np.float32).reshape(1, 4, 1, 1), "with_zero"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "three"], ["a"], name="add3"),
        helper.make_node("Clip", ["a", "zero", "six"], ["r6"], name="relu6"),
        helper.make_node("Mul", ["c1", "r6"], ["m"], name="gate"),
        helper.make_node("Div", ["m", "six"], ["hs"], name="div6"),
        helper.make_node("Conv", ["hs", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Div", ["c2", "with_zero"], ["out"], name="div_zero"),
    ]
    graph = helper.make_graph(
        nodes,
        "hard_swish",
        [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_division_by_a_constant_becomes_a_product_the_cpu_platform_keeps_integer() -> None:
    model = hard_swish_convs()
    prepared = prepare(model)
    nodes = {node.name: node for node in prepared.model.graph.node}
    assert prepared.divisions_as_products == ("div6",)
    assert nodes["div6"].op_type == "Mul" and nodes["div6"].output == ["hs"]
    assert nodes["div_zero"].op_type == "Div"  # a divisor holding 0 has no reciprocal
    x = np.random.default_rng(1).normal(size=(4, 3, 8, 8)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(  # noqa: E731
        None, {"input": x}
    )[0]
    expected, actual = run(model), run(prepared.model)
    finite = np.isfinite(expected)  # the division by 0 writes inf/nan in both
    # x · (1/6) against x / 6: one rounding of 1/6 more, a relative 1e-7, carried through conv2
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-6)
    annotation = annotate(prepared, QuantizeConfig(platform="onnxruntime"))
    # the product by 1/6 joins the gate's uint8 chain (QLinearMul) up to conv2: no float island left between them
    assert annotation.decisions["div6"] == "quantized" and {"m", "hs"} <= set(annotation.configs)
