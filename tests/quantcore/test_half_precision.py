"""Half-precision models (``quantcore.prepare.half_precision``): computed in float32 inside, their interface
kept, then quantized like any float32 model. The float16 models are made as users make them: with
onnxconverter-common's converter (edges kept or not, float32 islands) and with ``model.half()``
before ``torch.onnx.export``."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

from quantcore import QuantizeConfig, prepare, quantize
from quantcore.graph.index import iter_tensors, node_subgraphs
from quantcore.prepare.half_precision import HALF
from quantcore.tensorrt.qdq_rules import check_qdq, summarize
from samples.zoo import TinyEncoder, build, export

FP16_STEP = 2.0**-10  # float16's relative spacing: one rounding of an output to float16 is within it


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _rounded_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each float32 initializer rounded to float16 and back: the float32 computation of
    the weights a float16 copy of it holds."""
    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    for tensor in rounded.graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            array = numpy_helper.to_array(tensor).astype(np.float16).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return rounded


def _model(nodes: list[onnx.NodeProto], inputs, outputs, initializers) -> onnx.ModelProto:
    """A hand-built opset-17 model."""
    graph = helper.make_graph(nodes, "bf16", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _types(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(v.name, v.type.tensor_type.elem_type) for v in [*model.graph.input, *model.graph.output]]


def _half_types_inside(graph: onnx.GraphProto) -> Iterator[str]:
    """What still says a half type inside ``graph``: stored tensors, value_info, Cast targets and
    subgraph interfaces (the main graph's inputs and outputs are its interface, not inside)."""
    yield from (f"tensor {t.name}" for t in iter_tensors(graph) if t.data_type in HALF)
    yield from (f"value_info {v.name}" for v in graph.value_info if v.type.tensor_type.elem_type in HALF)
    for node in graph.node:
        yield from (f"{node.name}.{a.name}" for a in node.attribute if a.name in ("to", "dtype") and a.i in HALF)
        for subgraph in node_subgraphs(node):
            interface = [*subgraph.input, *subgraph.output]
            yield from (f"{subgraph.name} {v.name}" for v in interface if v.type.tensor_type.elem_type in HALF)
            yield from _half_types_inside(subgraph)


@pytest.mark.parametrize(
    "conversion",
    [{}, {"keep_io_types": True}, {"keep_io_types": True, "op_block_list": ["GlobalAveragePool", "Add"]}],
    ids=["float16-edges", "float32-edges", "float32-islands"],
)
def test_a_converted_model_computes_in_float32_inside_with_its_interface_kept(conversion: dict) -> None:
    """The zoo ResNet (BatchNormalization nodes, residual Adds) through onnxconverter-common: every
    tensor inside becomes float32, the inputs and outputs keep their names and types, and the outputs
    are those of the float32 computation of the converted weights."""
    zoo = build("resnet")
    half = float16.convert_float_to_float16(zoo.model, **conversion)
    prepared = prepare(half)
    assert prepared.widened_from == "float16"
    assert any("computes in float16" in w for w in prepared.warnings)
    assert _types(prepared.model) == _types(half)
    graph = prepared.model.graph
    outputs, inputs = {o.name for o in graph.output}, {i.name for i in graph.input}
    edges = {f"{n.name}.to" for n in graph.node if n.op_type == "Cast" and set(n.output) <= outputs}
    assert set(_half_types_inside(graph)) <= edges
    # the converter's Casts between float16 and float32 convert float32 to float32 now: gone (its last
    # one's producer writes the output itself); those left are the edges
    assert {n.name for n in graph.node if n.op_type == "Cast"} == {
        n.name for n in graph.node if n.op_type == "Cast" and (n.output[0] in outputs or n.input[0] in inputs)
    }
    assert sum(n.op_type == "Cast" for n in graph.node) == (0 if conversion else 2)

    x = zoo.inputs["input"][:8]
    feed = x.astype(np.float16) if not conversion else x
    (actual,) = _run(prepared.model, {"input": feed})
    (expected,) = _run(_rounded_weights(zoo.model), {"input": feed.astype(np.float32)})
    # the same float32 arithmetic but for BatchNormalization folded into the convs (a few float32 ulps
    # of the output's magnitude), then, with float16 edges, the output rounded to float16 (one step)
    scale = float(np.abs(expected).max())
    rtol = FP16_STEP if actual.dtype == np.float16 else 0.0
    np.testing.assert_allclose(actual.astype(np.float32), expected, rtol=rtol, atol=1e-5 * scale)


@pytest.mark.parametrize("edges", [np.float16, np.float32], ids=["float16-edges", "float32-edges"])
def test_the_digits_cnn_in_float16_quantizes_and_keeps_its_accuracy(digits_sample, tmp_path, edges) -> None:
    """The trained sample CNN converted to float16, its input and output too or kept float32, quantized
    for ONNX Runtime: it gets the float32 model's Q/DQ nodes and integer kernels, keeps its interface,
    and its top-1 stays within the issue's 0.5 points of the converted model's."""
    conversion = {"keep_io_types": edges == np.float32}
    half = float16.convert_float_to_float16(onnx.load(digits_sample.model_path), **conversion)
    onnx.save(half, tmp_path / "digits16.onnx")
    calibration = {"input": digits_sample.images[:256].astype(edges)}
    evaluation = {"input": digits_sample.images[1297:].astype(edges)}
    config = QuantizeConfig(platform="onnxruntime", cpu_latency=False)
    labels = digits_sample.evaluation_labels
    result = quantize(tmp_path / "digits16.onnx", calibration, evaluation, config, tmp_path / "q16", labels=labels)
    single = quantize(
        digits_sample.model_path,
        digits_sample.calibration,
        digits_sample.evaluation,
        config,
        tmp_path / "q32",
        labels=labels,
    )
    report, reference = result.report, single.report
    assert report["prepare"]["widened_from"] == "float16" and reference["prepare"]["widened_from"] is None
    # what the model as given loses against its float32 computation: float16 keeps 11 significant bits
    # (about 66 dB a rounding); a few layers of them stay far above 30 dB
    (given,) = [w for w in report["warnings"] if "the model as given" in w]
    assert float(re.search(r"SQNR of '\w+' ([0-9.]+) dB", given).group(1)) > 30
    for key in ("quantize_linear_nodes", "dequantize_linear_nodes"):
        assert report["evaluation"]["model"][key] == reference["evaluation"]["model"][key] > 0
    deployed = report["evaluation"]["qdq_deployed"]
    assert deployed["integer_kernels"] == reference["evaluation"]["qdq_deployed"]["integer_kernels"] > 0
    assert abs(deployed["top1"] - report["evaluation"]["fp32"]["top1"]) <= 0.5
    exported = onnx.load(result.model_path)
    assert _types(exported) == _types(half)
    (logits,) = _run(exported, evaluation)
    assert logits.dtype == edges and logits.shape == (500, 10)


def test_a_torch_half_export_with_dynamic_axes_quantizes_like_its_float32_export(tmp_path) -> None:
    """The zoo's transformer encoder (Gather embeddings, attention, LayerNormalization, Erf) exported
    after ``model.half()``, with dynamic batch and sequence axes: on either integer preset it gets the
    float32 export's Q/DQ nodes and integer kernels, runs on other batch and sequence sizes, and passes
    the graph checks of TensorRT's Q/DQ rules."""
    zoo = build("transformer")
    torch.manual_seed(5)  # the zoo model's weights: build("transformer") draws them after this seed
    axes = {"tokens": {0: "N", 1: "T"}, "output": {0: "N", 1: "T"}}
    example = (torch.from_numpy(zoo.inputs["tokens"][:2]),)
    onnx.save(export(TinyEncoder().half(), example, ["tokens"], ["output"], axes), tmp_path / "half.onnx")
    onnx.save(zoo.model, tmp_path / "single.onnx")
    for platform in ("tensorrt", "onnxruntime"):
        config = QuantizeConfig(platform=platform, cpu_latency=False)
        runs = {
            name: quantize(tmp_path / f"{name}.onnx", zoo.calibration, zoo.evaluation, config, tmp_path / name)
            for name in ("half", "single")
        }
        half, single = (runs[name].report["evaluation"] for name in ("half", "single"))
        assert half["model"]["quantize_linear_nodes"] == single["model"]["quantize_linear_nodes"] > 0
        deployed = {name: runs[name].report["evaluation"]["qdq_deployed"] for name in runs}
        assert deployed["half"]["integer_kernels"] == deployed["single"]["integer_kernels"]
        assert deployed["half"]["disabled_optimizers"] == deployed["single"]["disabled_optimizers"]
        # On a CPU without VNNI the tensorrt preset's full-range int8 weights saturate ONNX Runtime's u8s8
        # kernels, and the parity remedy turns the Q/DQ fusions off: then no integer kernel runs, in both.
        if not deployed["single"]["disabled_optimizers"]:
            assert deployed["single"]["integer_kernels"] > 0
        exported = onnx.load(runs["half"].model_path)
        (output,) = _run(exported, zoo.resized)
        assert output.dtype == np.float16 and output.shape == (*zoo.resized["tokens"].shape, 4)
        if platform == "tensorrt":  # the edge Casts break none of TensorRT's Q/DQ rules (no GPU here to build)
            assert summarize(check_qdq(exported))["errors"] == 0


def test_bfloat16_inside_constants_attributes_and_branches_computes_in_float32() -> None:
    """A float32-interface model that computes in bfloat16 (which ONNX Runtime's CPU provider cannot
    run): a bfloat16 weight, a Constant, a ConstantOfShape fill, EyeLike's dtype and an If (on a graph
    input, so it stays) whose branches hold a bfloat16 initializer and declare bfloat16 outputs. Widened,
    it runs, and gives the float32 computation of its bfloat16 values (numpy below)."""
    rng = np.random.default_rng(3)
    weight, shift = rng.normal(0, 1, (4, 4)), rng.normal(0, 1, 4)

    def bf16(name: str, values) -> TensorProto:
        values = np.asarray(values, np.float32)
        return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, values.flatten().tolist())

    def branch(name: str, node: onnx.NodeProto, initializers=()) -> onnx.GraphProto:
        output = helper.make_tensor_value_info(node.output[0], TensorProto.BFLOAT16, None)
        return helper.make_graph([node], name, [], [output], list(initializers))

    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], name="to_bf16", to=TensorProto.BFLOAT16),
        helper.make_node("MatMul", ["xb", "w"], ["h"], name="matmul"),
        helper.make_node("Constant", [], ["c"], name="shift", value=bf16("c", shift)),
        helper.make_node("Add", ["h", "c"], ["a"], name="add"),
        helper.make_node("Shape", ["a"], ["shape"], name="shape"),
        helper.make_node("ConstantOfShape", ["shape"], ["halves"], name="fill", value=bf16("v", [0.5])),
        helper.make_node("EyeLike", ["a"], ["eye"], name="eye", dtype=TensorProto.BFLOAT16),
        helper.make_node("Mul", ["a", "halves"], ["m0"], name="mul"),
        helper.make_node("Add", ["m0", "eye"], ["m"], name="add_eye"),
        helper.make_node(
            "If",
            ["flag"],
            ["picked"],
            name="branch",
            then_branch=branch("then", helper.make_node("Relu", ["m"], ["relu"], name="then_relu")),
            else_branch=branch(
                "else", helper.make_node("Mul", ["m", "two"], ["twice"], name="else_mul"), [bf16("two", 2.0)]
            ),
        ),
        helper.make_node("Cast", ["picked"], ["y"], name="to_float", to=TensorProto.FLOAT),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [bf16("w", weight)],
    )
    prepared = prepare(model)
    assert prepared.widened_from == "bfloat16"
    assert not list(_half_types_inside(prepared.model.graph))
    assert not [n for n in prepared.model.graph.node if n.op_type == "Cast" and n.output[0] != "y"]

    def rounded(values: np.ndarray) -> np.ndarray:  # to bfloat16 and back: what the model stores
        return numpy_helper.to_array(bf16("r", values)).astype(np.float32)

    x = rng.normal(0, 1, (3, 4)).astype(np.float32)
    joined = (x @ rounded(weight) + rounded(shift)) * 0.5 + np.eye(3, 4, dtype=np.float32)
    for flag, expected in ((True, np.maximum(joined, 0)), (False, joined * 2)):
        (y,) = _run(prepared.model, {"x": x, "flag": np.array(flag)})
        # float32 throughout, as the numpy reference: a few float32 ulps
        np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_a_bfloat16_model_onnx_runtime_cannot_run_is_quantized_and_measured_in_float32(tmp_path) -> None:
    """Two bfloat16 MatMuls behind a float32 interface: ONNX Runtime's CPU provider has no bfloat16
    MatMul, so the model as given cannot be the reference. The job runs through evaluation and CPU
    latency, both against the model's float32 computation, which the report says."""
    rng = np.random.default_rng(4)
    weights = [rng.normal(0, 0.4, (8, 8)).astype(np.float32) for _ in range(2)]
    stored = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]
    for tensor in stored:  # bfloat16 as the model stores it (ml_dtypes, which onnx's numpy_helper reads)
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype("bfloat16"), tensor.name))
    nodes = [
        helper.make_node("Cast", ["x"], ["xb"], name="to_bf16", to=TensorProto.BFLOAT16),
        helper.make_node("MatMul", ["xb", "w0"], ["h"], name="matmul0"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w1"], ["yb"], name="matmul1"),
        helper.make_node("Cast", ["yb"], ["y"], name="to_float", to=TensorProto.FLOAT),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        stored,
    )
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        _run(model, {"x": np.zeros((1, 8), np.float32)})
    onnx.save(model, tmp_path / "bf16.onnx")
    x = rng.normal(0, 1, (96, 8)).astype(np.float32)
    config = QuantizeConfig(platform="onnxruntime")
    result = quantize(tmp_path / "bf16.onnx", {"x": x[:64]}, {"x": x[64:]}, config, tmp_path / "out")
    report = result.report
    assert report["prepare"]["widened_from"] == "bfloat16"
    assert report["evaluation"]["model"]["quantize_linear_nodes"] > 0
    assert any("float32 computation" in note for note in report["latency"]["cpu"]["notes"])
    assert any("cannot run the model as given, in bfloat16" in warning for warning in report["warnings"])
    # the reported error is against the float32 computation of the bfloat16 weights (numpy here)
    w0, w1 = (numpy_helper.to_array(t).astype(np.float32) for t in stored)
    expected = np.maximum(x[64:] @ w0, 0) @ w1
    (deployed,) = _run(onnx.load(result.model_path), {"x": x[64:]})
    error = float(np.sum((deployed.astype(np.float64) - expected) ** 2))
    sqnr = 10 * np.log10(float(np.sum(expected.astype(np.float64) ** 2)) / error)
    # float32 rounding of the reference's sums against numpy's: far below the 8-bit error
    assert report["evaluation"]["qdq_deployed"]["outputs"]["y"]["sqnr_db"] == pytest.approx(sqnr, abs=0.01)
