"""Attention probabilities: the MatMuls that read a Softmax's output, and how many positions it spans.

An attention's second product, P · V, reads probabilities P = Softmax(scores) over L positions. They
average 1/L, and 8-bit linear quantization of P rounds to a step of amax/127 (symmetric) or amax/255
(asymmetric) for the whole tensor: over long sequences most probabilities are a step or less, and
rounding erases or doubles them. Scratch measurement (random 64-wide heads, amax at the 99.99th
percentile, 127 levels, SQNR of P · V): 30 to 40 dB at L = 32, 21 to 33 dB at L = 256, 11 to 22 dB at
L = 1024. On Whisper's encoder (smart-turn v3, L = 400), keeping P · V float took the tensorrt preset's
output from 9.0 to 15.0 dB and the academic preset's from 13.9 to 20.7; on a BERT of 48 tokens it did not
help. FP8's steps are relative, so it keeps small probabilities (the tensorrt-fp8 preset lost 1.2 dB by
keeping them float): only integer presets keep long attention float (``quantcore.annotate.annotation``).

``attention_products`` finds the products; prepare measures L on its sample
(``quantcore.prepare.shapes.runtime_outputs``), or reads it from the inferred shapes, and records it in
``PreparedModel.attention_positions``.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from quantcore.graph.index import GraphIndex

LONG_ATTENTION = 128  # positions beyond which integer presets keep the probabilities' product float
# ops that move a Softmax's values unchanged on their way to the product (head reshapes, dropout at export)
CARRIERS = frozenset({"Identity", "Dropout", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Cast"})


def _softmax_source(name: str, index: GraphIndex) -> onnx.NodeProto | None:
    """The Softmax whose output ``name`` is, directly or behind ``CARRIERS``; None if it is not one."""
    producer = index.producers.get(name)
    while producer is not None and producer.op_type in CARRIERS:
        producer = index.producers.get(producer.input[0])
    return producer if producer is not None and producer.op_type == "Softmax" else None


def attention_products(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """MatMul node name → the Softmax one of its operands comes from (through ``CARRIERS``)."""
    index = GraphIndex(graph)
    found = {}
    for node in graph.node:
        if node.op_type == "MatMul":
            sources = [s for s in (_softmax_source(i, index) for i in node.input[:2]) if s is not None]
            if sources:
                found[node.name] = sources[0]
    return found


def softmax_positions(softmax: onnx.NodeProto, shape: tuple[int, ...], opset: int) -> int:
    """How many values one of ``softmax``'s distributions spans, for an output of ``shape``: the size of
    its axis (opset 13 on, default -1), or of every axis from it on (before 13, default 1)."""
    axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    axis = axis % len(shape) if shape else 0
    if opset >= 13:
        return int(shape[axis]) if shape else 1
    positions = 1
    for size in shape[axis:]:
        positions *= int(size)
    return positions


def attention_positions(
    products: Mapping[str, onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]], opset: int
) -> dict[str, int]:
    """MatMul node name → positions of its Softmax's distributions, for the products whose Softmax output
    has a known shape in ``shapes``."""
    return {
        name: softmax_positions(softmax, shapes[softmax.output[0]], opset)
        for name, softmax in products.items()
        if softmax.output[0] in shapes
    }
