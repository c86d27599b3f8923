"""The FP32 model rewritten to FP16, so that a strongly typed TensorRT build of it is the FP16 baseline
the INT8 engine's speed is compared with (precision flags, the old way to ask for FP16, are gone).

Rewrite (float32 I/O kept, so both engines take the same inputs):
- every float32 initializer and float32 ``Constant`` tensor becomes float16, and ``Cast(to=FLOAT)``
  becomes ``Cast(to=FLOAT16)``, except on the paths computing Resize/Upsample scales and roi, which
  ONNX wants in float32 (followed back from those inputs through their producers, stopping at
  Shape/Size, whose outputs are integers);
- a float32 graph input x gets ``Cast(x → x_fp16, FLOAT16)`` in front of its readers, a float32 graph
  output y is produced as ``y_fp16`` and cast back by ``Cast(y_fp16 → y, FLOAT)`` (``quantcore.graph.edges``);
- subgraphs (If/Loop/Scan bodies) are rewritten the same way, their declared float32 inputs and
  outputs becoming float16; the main graph's ``value_info`` is dropped (stale float32 declarations).
Values beyond ±65504 saturate to ±inf in float16: ``saturated`` counts such initializer elements so the
report can say why an FP16 baseline is off. Ops whose attributes choose an output type (RandomNormal,
EyeLike ``dtype``, ConstantOfShape ``value``) are not rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quantcore.graph.edges import cast_edges
from quantcore.graph.index import GraphIndex

FLOAT32_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}  # (op, input positions) that stay float32
INTEGER_SOURCES = ("Shape", "Size")  # where the backward walk of a float32 path stops
FP16_MAX = float(np.finfo(np.float16).max)


@dataclass(frozen=True)
class HalfModel:
    model: onnx.ModelProto
    converted_tensors: int
    saturated: int  # initializer elements beyond float16's range


class _Counts:
    def __init__(self) -> None:
        self.converted = 0
        self.saturated = 0

    def half(self, tensor: onnx.TensorProto) -> None:
        values = numpy_helper.to_array(tensor)
        self.saturated += int(np.count_nonzero(np.abs(values) > FP16_MAX))
        self.converted += 1
        tensor.CopyFrom(numpy_helper.from_array(values.astype(np.float16), tensor.name))


def float32_paths(graph: onnx.GraphProto) -> tuple[set[str], set[tuple[str, ...]]]:
    """(tensors, nodes by their outputs) that compute Resize/Upsample scales and roi and must stay float32."""
    index = GraphIndex(graph)
    stack = [
        node.input[position]
        for node in graph.node
        for position in FLOAT32_INPUTS.get(node.op_type, ())
        if position < len(node.input) and node.input[position]
    ]
    tensors: set[str] = set()
    nodes: set[tuple[str, ...]] = set()
    while stack:
        name = stack.pop()
        if name in tensors:
            continue
        tensors.add(name)
        producer = index.producers.get(name)
        if producer is None or producer.op_type in INTEGER_SOURCES:
            continue
        nodes.add(tuple(producer.output))
        stack.extend(i for i in producer.input if i)
    return tensors, nodes


def _rewrite(graph: onnx.GraphProto, counts: _Counts, *, declared_io: bool) -> None:
    """Initializers, Constants, Casts of ``graph`` (and its subgraphs) to float16. declared_io: also
    turn float32 inputs/outputs/value_info declarations to float16 (subgraphs)."""
    keep_tensors, keep_nodes = float32_paths(graph)
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT and tensor.name not in keep_tensors:
            counts.half(tensor)
    for node in graph.node:
        kept = tuple(node.output) in keep_nodes
        for attribute in node.attribute:
            if node.op_type == "Constant" and attribute.name == "value" and not kept:
                if attribute.t.data_type == TensorProto.FLOAT:
                    counts.half(attribute.t)
            elif node.op_type == "Cast" and attribute.name == "to" and not kept and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16
            for subgraph in [*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])]:
                _rewrite(subgraph, counts, declared_io=True)
    if declared_io:
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.tensor_type.elem_type == TensorProto.FLOAT and value.name not in keep_tensors:
                value.type.tensor_type.elem_type = TensorProto.FLOAT16


def to_float16(model: onnx.ModelProto) -> HalfModel:
    """A new model computing ``model`` in float16 with float32 inputs and outputs (see module doc)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    counts = _Counts()
    _rewrite(graph, counts, declared_io=False)
    cast_edges(graph, {TensorProto.FLOAT}, TensorProto.FLOAT16, "_fp16")
    del graph.value_info[:]
    return HalfModel(model=copy, converted_tensors=counts.converted, saturated=counts.saturated)
