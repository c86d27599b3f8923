"""Channel scaling of MatMul/Gemm inputs: W_j ← s_j · W_j for the weights that multiply channel j of an
activation X, and X_j ← X_j / s_j folded into X's producer or an inserted Mul, so that the graph computes
the same function (to the float32 rounding of the rescaled constants). SmoothQuant
(``quantcore.calibrate.smoothquant``) and AWQ (``quantcore.weight_only.awq``) choose s; this module
applies it.

A group is the MatMul/Gemm nodes that read one float activation X as their data operand (input 0, Gemm
without transA) through a float32 initializer weight W read by that node alone (MatMul: rank >= 2).
Every reader of X that is no such node (a residual Add, a MatMul of two activations) is left alone.
X ÷ s is absorbed exactly into X's producer where X is read by the group alone, is no graph output, and
the producer is (``_absorption``):

    LayerNormalization           its scale and bias ÷ s (they multiply the last axis element-wise)
    Mul by a constant            the constant ÷ s (broadcast to the last axis)
    Add of a constant            the constant ÷ s, and the other operand's producer absorbs ÷ s in turn
                                 (a Linear's MatMul + bias Add, a LayerNorm written out as Mul + Add)
    MatMul / Gemm, constant W    its output columns ÷ s (MatMul: W's last axis; Gemm: B's N axis, C too)

A Conv's output channels are its axis 1, never the last axis a MatMul reduces over, so a Conv producer
does not absorb. Elsewhere (X also read by a residual, X a graph input, a Gelu before it) a Mul by the
constant 1/s is inserted before the group: exact as well, at the cost of one element-wise pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.graph.index import GraphIndex, NameScope

LAYERS = frozenset({"MatMul", "Gemm"})


@dataclass(frozen=True)
class Group:
    """The layers reading activation ``input`` that share one s; ``absorbed``: the initializers that take
    ÷ s as (name, axis of the s vector: -1 broadcasts along the last axis, 0 along the first), or None
    when a Mul by 1/s is inserted."""

    input: str
    layers: tuple[str, ...]  # node names, graph order
    absorbed: tuple[tuple[str, int], ...] | None


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _own_float_initializer(index: GraphIndex, name: str) -> bool:
    return index.is_initializer(name) and index.is_float32(name, unknown=False) and len(index.consumers[name]) == 1


def _is_layer(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """A MatMul/Gemm reading an activation through a weight of its own (module docstring)."""
    if node.op_type not in LAYERS or len(node.input) < 2 or index.is_constant(node.input[0]):
        return False
    if not (index.is_float32(node.input[0], unknown=True) and _own_float_initializer(index, node.input[1])):
        return False
    if node.op_type == "Gemm":
        return not attributes(node).get("transA", 0)
    return len(index.initializers[node.input[1]].dims) >= 2


def _absorption(index: GraphIndex, tensor: str) -> list[tuple[str, int]] | None:
    """The initializers (name, axis) whose division by s divides ``tensor`` by s along its last axis,
    exactly (module table), or None. ``tensor``'s readers are checked by the caller."""
    producer = index.producers.get(tensor)
    if producer is None or tensor in index.graph_outputs or producer.output[0] != tensor:
        return None  # (a LayerNormalization's mean and inverse deviation outputs do not scale with it)
    op, inputs = producer.op_type, [name for name in producer.input if name]
    if op == "LayerNormalization" and all(_own_float_initializer(index, n) for n in inputs[1:]):
        return [(name, -1) for name in inputs[1:]]
    if op in ("Mul", "Add") and len(inputs) == 2:
        constants = [n for n in inputs if _own_float_initializer(index, n)]
        others = [n for n in inputs if n not in constants]
        if len(constants) != 1 or len(others) != 1:
            return None
        if op == "Mul":
            return [(constants[0], -1)]
        readers = index.consumers.get(others[0], [])
        inner = _absorption(index, others[0]) if len(readers) == 1 else None
        return None if inner is None else [(constants[0], -1), *inner]
    if op == "MatMul" and _is_layer(producer, index):
        return [(producer.input[1], -1)]  # (..., K, N): output columns on the last axis
    if op == "Gemm" and _is_layer(producer, index):
        bias = [(name, -1) for name in inputs[2:3]]
        if bias and not _own_float_initializer(index, bias[0][0]):
            return None
        return [(producer.input[1], 0 if attributes(producer).get("transB", 0) else -1), *bias]
    return None


def find_groups(graph: onnx.GraphProto) -> list[Group]:
    """Every group of the module docstring, in graph order of its first layer, before any statistics."""
    index = GraphIndex(graph)
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        if _is_layer(node, index):
            readers.setdefault(node.input[0], []).append(node.name)
    groups = []
    for tensor, layers in readers.items():
        alone = len(index.consumers[tensor]) == len(layers)  # X read by the group alone
        absorbed = _absorption(index, tensor) if alone else None
        groups.append(Group(tensor, tuple(layers), None if absorbed is None else tuple(absorbed)))
    return groups


def scale_channels(
    model: onnx.ModelProto,
    groups: list[Group],
    scales: Mapping[str, np.ndarray],
    *,
    replaced: Set[str] = frozenset(),
    read: Callable[[onnx.TensorProto], np.ndarray] = numpy_helper.to_array,
) -> onnx.ModelProto:
    """A copy of ``model`` with each group's W_j ← s_j · W_j and X ÷ s absorbed or a Mul by 1/s inserted
    (module docstring); ``scales``: group input → (C,) s, C the last axis of X. The groups' rescalings
    commute (each s multiplies constants of its own), so they may come from the original model's values.
    ``replaced``: initializers left as they are, because the caller replaces them with values it rescaled
    itself (a weight-only export's quantized weights); ``read``: an initializer's value (the model's
    external data may still be in its file)."""
    graph = model.graph
    index = GraphIndex(graph)
    nodes = {node.name: node for node in graph.node}
    positions = {node.name: i for i, node in enumerate(graph.node)}
    values: dict[str, np.ndarray] = {}  # initializer → its float64 value as rescaled so far

    def rescale(name: str, factor: np.ndarray, axis: int) -> None:
        if name in replaced:
            return
        value = values[name] if name in values else read(index.initializers[name]).astype(np.float64)
        values[name] = value * (factor.reshape(-1, 1) if axis == 0 else factor)  # broadcast as ONNX would

    scaled = onnx.ModelProto()
    scaled.CopyFrom(model)
    scope = NameScope(index.used_names())
    inserted: list[tuple[int, onnx.NodeProto]] = []  # (position of the group's first layer, its Mul)
    value_infos = {v.name: v for v in [*graph.input, *graph.value_info]}
    for group in groups:
        scale = np.asarray(scales[group.input], dtype=np.float64)
        for layer in group.layers:  # W_j ← s_j · W_j
            node = nodes[layer]
            if node.op_type == "Gemm" and attributes(node).get("transB", 0):
                rescale(node.input[1], scale, -1)  # B is (N, K)
            else:
                rescale(node.input[1], scale[:, None], -1)  # (..., K, N)
        if group.absorbed is not None:
            for name, axis in group.absorbed:
                rescale(name, 1.0 / scale, axis)
            continue
        divided = scope.fresh(f"{group.input}.smoothed")
        reciprocal = scope.fresh(f"{group.input}.smoothing")
        scaled.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), reciprocal))
        mul = onnx.helper.make_node(
            "Mul", [group.input, reciprocal], [divided], name=scope.fresh(f"{group.input}.smooth")
        )
        inserted.append((min(positions[n] for n in group.layers), mul))
        for node in scaled.graph.node:
            if node.name in group.layers:
                node.input[0] = divided
        if group.input in value_infos:
            info = scaled.graph.value_info.add()
            info.CopyFrom(value_infos[group.input])
            info.name = divided
    for position, mul in sorted(inserted, key=lambda item: item[0], reverse=True):
        scaled.graph.node.insert(position, mul)  # from the back: earlier positions stay valid
    for tensor in scaled.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name].astype(np.float32), tensor.name))
    return scaled
