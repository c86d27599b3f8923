"""How many of a quantized model's quantizable layers its method left float, read from the exported model
alone, so that every method of ``bench.quality`` is counted the same way (quantcore's presets and auto
search, ``quantize_static``'s QDQ models, ``quantize_dynamic``'s integer operators).

A quantizable layer is a node with a weight operand (``quantcore.graph.ops.COMPUTE_OPS``: Conv,
ConvTranspose, Gemm, MatMul, weighted or not: an attention MatMul counts too), in the graph and its
subgraphs, or the integer operator a method wrote in its place (ConvInteger, MatMulInteger, QLinearConv,
QLinearMatMul, MatMulIntegerToFloat, QGemm: quantized by construction). A layer is left float when
neither its data nor its weight operand (inputs 0 and 1) comes from a DequantizeLinear, looking back
through ops that only move values (``DATA_MOVEMENT_OPS``: a Transpose or Reshape between the
DequantizeLinear and the layer is how some placements write it). Whatever kept the layer float counts
alike: a rule of the platform (long attention, a Log's argument), an excluded node, the auto search's
fallback, or a method that does not reach that op type. Recurrent cells (LSTM, GRU) are not counted:
no static method here quantizes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from quantcore.graph.ops import COMPUTE_OPS, DATA_MOVEMENT_OPS

INTEGER_LAYERS = frozenset(
    {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "QGemm"}
)


@dataclass(frozen=True)
class LayerCount:
    """``layers`` quantizable layers, ``float_layers`` of them left float."""

    float_layers: int
    layers: int


def _reads_dequantized(name: str, producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether tensor ``name`` is a DequantizeLinear's output, directly or through data movement ops."""
    seen = set()
    while name in producers and name not in seen:
        seen.add(name)
        node = producers[name]
        if node.op_type == "DequantizeLinear":
            return True
        if node.op_type not in DATA_MOVEMENT_OPS or not node.input:
            return False
        name = node.input[0]
    return False


def _count(graph: onnx.GraphProto, outer: dict[str, onnx.NodeProto]) -> tuple[int, int]:
    """(float layers, layers) of ``graph`` and its subgraphs; ``outer``: the producers of enclosing scopes."""
    producers = {**outer, **{output: node for node in graph.node for output in node.output}}
    left_float = layers = 0
    for node in graph.node:
        if node.op_type in INTEGER_LAYERS:
            layers += 1
        elif node.op_type in COMPUTE_OPS:
            layers += 1
            left_float += not any(_reads_dequantized(name, producers) for name in node.input[:2])
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for subgraph in subgraphs:
                sub_float, sub_layers = _count(subgraph, producers)
                left_float, layers = left_float + sub_float, layers + sub_layers
    return left_float, layers


def float_layers(model: onnx.ModelProto) -> LayerCount:
    """The quantizable layers of ``model`` (an exported model) and how many of them are left float."""
    left_float, layers = _count(model.graph, {})
    return LayerCount(left_float, layers)
