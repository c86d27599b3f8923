"""GPTQ's sequential run, segment by segment (``quantcore.weight_only.segments``): where the graph is
cut, and that each layer's Gram comes from the model whose earlier segments are already quantized; with
one segment the run is the whole-model GPTQ exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantcore import QuantizeConfig, annotate, prepare
from quantcore.config import WeightOnlyConfig
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches, input_specs
from quantcore.weight_only import quantize_layer, quantize_sequentially, weight_layers
from quantcore.weight_only.layers import IN_MEMORY
from quantcore.weight_only.segments import Segment, layer_by_layer, plan, run
from samples.large import external_decoder
from tests.quantcore.gram_reference import collect_grams, quantize_whole

CONFIG = QuantizeConfig(
    platform="onnxruntime-weight-only", precision="w4", weight_only=WeightOnlyConfig(algorithm="gptq", block_size=32)
)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory):
    """The 2-block decoder of ``samples.large`` (d_model 64), loaded whole, its layers and 2 batches of tokens."""
    prepared = prepare(external_decoder(tmp_path_factory.mktemp("decoder"), d_model=64, layers=2))
    layers = weight_layers(prepared.model, annotate(prepared, CONFIG))
    tokens = {"input_ids": np.random.default_rng(3).integers(0, 256, size=(16, 12), dtype=np.int64)}
    return prepared.model, layers, Batches(tokens, input_specs(prepared.model), 8, what="calibration")


def test_a_decoder_is_cut_on_its_residual_stream(decoder) -> None:
    model, layers, _ = decoder
    segments = plan(model, layers)
    assert [[layer.node for layer in s.layers] for s in segments] == [
        ["q0", "k0", "v0", "o0"],
        ["up0", "down0"],
        ["q1", "k1", "v1", "o1"],
        ["up1", "down1"],
    ]
    # one activation crosses each cut: the residual sum; the last segment ends at its last layer
    assert [(s.inputs, s.outputs) for s in segments] == [
        (("input_ids",), ("x0a",)),
        (("x0a",), ("x0b",)),
        (("x0b",), ("x1a",)),
        (("x1a",), ()),
    ]
    assert model.graph.node[segments[-1].stop - 1].name == "down1"


def _layers(nodes: list[onnx.NodeProto], path: Path) -> tuple[onnx.ModelProto, list]:
    """x (n, 64) -> ``nodes`` (each MatMul by a (64, 64) weight named after its node) -> y (n, 64)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    initializers = [numpy_helper.from_array(w, n.input[1]) for n in nodes if n.op_type == "MatMul"]
    graph = helper.make_graph(nodes, "g", [x], [y], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    prepared = prepare(path)
    return prepared.model, weight_layers(prepared.model, annotate(prepared, CONFIG))


def test_a_graph_without_a_cut_between_layers_is_one_segment(tmp_path: Path) -> None:
    """One layer; and a graph whose nodes are not in topological order (nothing can be cut safely)."""
    residual = helper.make_node("Add", ["b", "x"], ["y"], name="add")  # y is no LM head: the MatMuls are quantized
    single, layers = _layers([helper.make_node("MatMul", ["x", "w"], ["b"], name="m"), residual], tmp_path / "1.onnx")
    assert [(s.start, s.stop, len(s.layers)) for s in plan(single, layers)] == [(0, 1, 1)]

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"], name="m0"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w1"], ["b"], name="m1"),
        residual,
    ]
    chain, layers = _layers(nodes, tmp_path / "2.onnx")
    assert [len(s.layers) for s in plan(chain, layers)] == [1, 1]  # in order: cut after m0
    chain.graph.node.insert(0, chain.graph.node.pop(1))  # Relu first: it reads a tensor made after it
    assert [len(s.layers) for s in plan(chain, layers)] == [2]


def _codes(entries) -> dict[str, np.ndarray]:
    return {entry.layer.node: entry.weight.codes for entry in entries}


def test_one_segment_is_the_whole_model_gptq(decoder) -> None:
    model, layers, batches = decoder
    whole = quantize_whole(layers, collect_grams(model, layers, batches), CONFIG)
    every_node = Segment(0, len(model.graph.node), tuple(layers), ("input_ids",), ())
    one = list(
        run(
            model,
            [every_node],
            batches,
            IN_MEMORY,
            "cpu",
            Monitor(),
            layer_by_layer(lambda layer, gram: quantize_layer(layer, gram, CONFIG)),
        )
    )
    # the same ONNX Runtime graph and batches: the same Grams, so the same codes and report rows
    assert [e.row for e in one] == [e.row for e in whole]
    for node, codes in _codes(whole).items():
        np.testing.assert_array_equal(_codes(one)[node], codes)


def test_later_segments_take_their_inputs_from_the_quantized_earlier_ones(decoder) -> None:
    """The second segment's layers (up0, down0) quantized with the Grams of the model whose first segment
    (q0, k0, v0, o0) computes with its dequantized weights, not with the FP32 model's."""
    model, layers, batches = decoder
    sequential = _codes(quantize_sequentially(model, layers, batches, CONFIG, Monitor(), IN_MEMORY))
    first, second = plan(model, layers)[:2]
    fp32 = collect_grams(model, layers, batches)
    quantized_first = [quantize_layer(layer, fp32[layer.activation], CONFIG) for layer in first.layers]

    replaced = onnx.ModelProto()
    replaced.CopyFrom(model)
    dequantized = {e.layer.weight_name: e.weight.dequantize() for e in quantized_first}
    for tensor in replaced.graph.initializer:
        if tensor.name in dequantized:
            tensor.CopyFrom(numpy_helper.from_array(dequantized[tensor.name], tensor.name))
    grams = collect_grams(replaced, list(second.layers), batches)
    for layer in first.layers:  # their inputs do not depend on any quantized weight
        np.testing.assert_array_equal(sequential[layer.node], _codes(quantized_first)[layer.node])
    for layer in second.layers:
        expected = quantize_layer(layer, grams[layer.activation], CONFIG).weight.codes
        # the same ONNX Runtime kernels on the same inputs: bit-identical activations, so the same codes
        np.testing.assert_array_equal(sequential[layer.node], expected)
        # and not the codes of GPTQ on the FP32 model's input (what a run without the feature gives)
        assert np.any(quantize_layer(layer, fp32[layer.activation], CONFIG).weight.codes != expected)


def test_a_segment_whose_layer_reads_a_graph_input_runs_nothing_to_get_it(tmp_path: Path) -> None:
    """x -> m0 and x -> m1, summed: cut between them (one tensor, m0's output, crosses); m1's segment is
    m1 alone and its input is x itself, fed, not computed. Neither layer's input depends on the other's
    weight, so the sequential run is the whole-model GPTQ."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"], name="m0"),
        helper.make_node("MatMul", ["x", "w1"], ["b"], name="m1"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    model, layers = _layers(nodes, tmp_path / "parallel.onnx")
    assert [(s.start, s.stop, s.inputs, s.outputs) for s in plan(model, layers)] == [
        (0, 1, ("x",), ()),
        (1, 2, ("x",), ()),
    ]
    data = {"x": np.random.default_rng(4).standard_normal((32, 64)).astype(np.float32)}
    batches = Batches(data, input_specs(model), 16, what="calibration")
    sequential = _codes(quantize_sequentially(model, layers, batches, CONFIG, Monitor(), IN_MEMORY))
    for node, codes in _codes(quantize_whole(layers, collect_grams(model, layers, batches), CONFIG)).items():
        np.testing.assert_array_equal(sequential[node], codes)
