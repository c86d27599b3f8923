"""Channel scaling of layer inputs: W_j ← s_j · W_j for the weights that multiply channel j of an
activation X, and X_j ← X_j / s_j folded into X's producer or an inserted Mul, so that the graph computes
the same function (to the float32 rounding of the rescaled constants). SmoothQuant
(``quantcore.calibrate.smoothquant``) and AWQ (``quantcore.weight_only.awq``) choose s; this module
applies it.

A group is the layers that read one float activation X as their data operand (input 0) through a float32
initializer weight W read by that node alone:

    MatMul / Gemm (without transA)   channel j on X's last axis, the axis the product reduces over
                                      (MatMul: W of rank >= 2, row j; Gemm: B's K axis)
    Conv (``convolutions=True``)      channel j on X's axis 1 (NCHW and its 1-D and 3-D kin); W is
                                      (O, C/g, k...) for g groups, and channel j meets W[o, j mod C/g] of the
                                      output channels o of its group: every input channel of a dense Conv,
                                      channel j alone of a depthwise one

Every reader of X that is no such node (a residual Add, a MatMul of two activations) is left alone, and
so is X when its readers are not all of one kind (channels on different axes). X ÷ s is absorbed exactly
into X's producer where X is read by the group alone, is no graph output, and the producer is
(``_absorption``):

    LayerNormalization           its scale and bias ÷ s (they multiply the last axis element-wise;
                                 last-axis groups only)
    Mul by a constant            the constant ÷ s, broadcast along X's channel axis (a scalar becomes a
                                 vector: a per-tensor affine step such as PP-LCNet's learnable one turns
                                 per-channel)
    Add of a constant            the constant ÷ s, and the other operand's producer absorbs ÷ s in turn
                                 (a Linear's MatMul + bias Add, a LayerNorm written out as Mul + Add)
    MatMul / Gemm, constant W    its output columns ÷ s (MatMul: W's last axis; Gemm: B's N axis, C too),
                                 for last-axis groups
    Conv, constant W             its output channels ÷ s (W's axis 0, and its bias), for Conv groups
    Relu, LeakyRelu              positively homogeneous (s > 0): their input's producer absorbs ÷ s in
                                 turn, where they are its only reader
    MaxPool                      the same along a Conv group's channels (a maximum within each channel)

Elsewhere (X also read by a residual, X a graph input, a Gelu before it) a MatMul/Gemm group gets a Mul
by the constant 1/s inserted before it: exact as well, at the cost of one element-wise pass. A Conv group
without an absorbing producer is no group: its Mul would be an element-wise pass over a whole feature
map, where a CNN's other element-wise ops fuse into their Conv. Zero padding commutes with the
division (0 / s = 0), so a Conv's borders compute the same function too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.graph.index import GraphIndex, NameScope

LAYERS = frozenset({"MatMul", "Gemm"})
# f(x / s) = f(x) / s for s > 0: element-wise ops homogeneous of degree 1, and a max over positions
# within each channel (channel-first groups only)
HOMOGENEOUS = frozenset({"Relu", "LeakyRelu"})
CHANNELWISE_HOMOGENEOUS = frozenset({"MaxPool"})
LAST_AXIS = -1  # ``Group.axis`` of MatMul/Gemm groups
CHANNEL_AXIS = 1  # ``Group.axis`` of Conv groups


@dataclass(frozen=True)
class Group:
    """The layers reading activation ``input`` that share one s along X's ``axis`` (``LAST_AXIS`` or
    ``CHANNEL_AXIS``); ``absorbed``: the initializers that take ÷ s as (name, position): s lies along
    the axis ``position`` counted from the end of that initializer (-1 its last axis, -k for a
    value of rank k its first), broadcast as ONNX would; None when a Mul by 1/s is inserted."""

    input: str
    layers: tuple[str, ...]  # node names, graph order
    absorbed: tuple[tuple[str, int], ...] | None
    axis: int = LAST_AXIS


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _own_float_initializer(index: GraphIndex, name: str) -> bool:
    return index.is_initializer(name) and index.is_float32(name, unknown=False) and len(index.consumers[name]) == 1


def _reads_activation(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """Input 0 a float activation, input 1 a float32 initializer of ``node``'s own."""
    if len(node.input) < 2 or index.is_constant(node.input[0]):
        return False
    return index.is_float32(node.input[0], unknown=True) and _own_float_initializer(index, node.input[1])


def _is_layer(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """A MatMul/Gemm reading an activation through a weight of its own (module docstring)."""
    if node.op_type not in LAYERS or not _reads_activation(node, index):
        return False
    if node.op_type == "Gemm":
        return not attributes(node).get("transA", 0)
    return len(index.initializers[node.input[1]].dims) >= 2


def _is_convolution(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """A Conv reading an activation through a weight (and bias, if any) of its own."""
    if node.op_type != "Conv" or not _reads_activation(node, index):
        return False
    bias = node.input[2] if len(node.input) > 2 else ""
    return len(index.initializers[node.input[1]].dims) >= 3 and (not bias or _own_float_initializer(index, bias))


def _absorption(index: GraphIndex, tensor: str, axis: int, rank: int) -> list[tuple[str, int]] | None:
    """The initializers (name, position) whose division by s divides ``tensor`` (of rank ``rank``) by s
    along ``axis``, exactly (module table), or None. ``tensor``'s readers are checked by the caller."""
    producer = index.producers.get(tensor)
    if producer is None or tensor in index.graph_outputs or producer.output[0] != tensor:
        return None  # (a LayerNormalization's mean and inverse deviation outputs do not scale with it)
    op, inputs = producer.op_type, [name for name in producer.input if name]
    position = -1 if axis == LAST_AXIS else axis - rank  # of s in a value broadcast against ``tensor``
    if op == "LayerNormalization" and axis == LAST_AXIS and all(_own_float_initializer(index, n) for n in inputs[1:]):
        return [(name, -1) for name in inputs[1:]]
    if op in ("Mul", "Add") and len(inputs) == 2:
        constants = [n for n in inputs if _own_float_initializer(index, n)]
        others = [n for n in inputs if n not in constants]
        if len(constants) != 1 or len(others) != 1:
            return None
        if op == "Mul":
            return [(constants[0], position)]
        readers = index.consumers.get(others[0], [])
        inner = _absorption(index, others[0], axis, rank) if len(readers) == 1 else None
        return None if inner is None else [(constants[0], position), *inner]
    if op in HOMOGENEOUS or (axis == CHANNEL_AXIS and op in CHANNELWISE_HOMOGENEOUS and len(producer.output) == 1):
        inner = inputs[0]
        return _absorption(index, inner, axis, rank) if len(index.consumers.get(inner, [])) == 1 else None
    if axis == LAST_AXIS and op == "MatMul" and _is_layer(producer, index):
        return [(producer.input[1], -1)]  # (..., K, N): output columns on the last axis
    if axis == LAST_AXIS and op == "Gemm" and _is_layer(producer, index):
        bias = [(name, -1) for name in inputs[2:3]]
        if bias and not _own_float_initializer(index, bias[0][0]):
            return None
        return [(producer.input[1], -2 if attributes(producer).get("transB", 0) else -1), *bias]
    if axis == CHANNEL_AXIS and _is_convolution(producer, index):
        weight = producer.input[1]
        return [(weight, -len(index.initializers[weight].dims)), *((name, -1) for name in inputs[2:3])]
    return None


def find_groups(graph: onnx.GraphProto, *, convolutions: bool = False) -> list[Group]:
    """Every group of the module docstring, in graph order of its first layer, before any statistics;
    Conv groups only with ``convolutions``."""
    index = GraphIndex(graph)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if _is_layer(node, index) or (convolutions and _is_convolution(node, index)):
            readers.setdefault(node.input[0], []).append(node)
    groups = []
    for tensor, layers in readers.items():
        kinds = {node.op_type == "Conv" for node in layers}
        if len(kinds) > 1:
            continue  # channels on two axes: no one s serves both
        axis = CHANNEL_AXIS if kinds == {True} else LAST_AXIS
        rank = len(index.initializers[layers[0].input[1]].dims)  # a Conv's input has its weight's rank
        alone = len(index.consumers[tensor]) == len(layers)  # X read by the group alone
        absorbed = _absorption(index, tensor, axis, rank) if alone else None
        if absorbed is None and axis == CHANNEL_AXIS:
            continue  # no Mul inserted before a Conv (module docstring)
        names = tuple(node.name for node in layers)
        groups.append(Group(tensor, names, None if absorbed is None else tuple(absorbed), axis))
    return groups


def _weight_factor(node: onnx.NodeProto, shape: tuple[int, ...], scale: np.ndarray) -> np.ndarray:
    """The factor, broadcast against ``node``'s weight of ``shape``, that multiplies the weights reading
    channel j by s_j (module table)."""
    if node.op_type == "Gemm":
        return scale if attributes(node).get("transB", 0) else scale[:, None]  # B (N, K) or (K, N)
    if node.op_type == "MatMul":
        return scale[:, None]  # (..., K, N)
    groups = attributes(node).get("group", 1)
    out_channels, per_group = shape[0], shape[1]
    factor = np.broadcast_to(scale.reshape(groups, 1, per_group), (groups, out_channels // groups, per_group))
    return factor.reshape(out_channels, per_group, *([1] * (len(shape) - 2)))


def scale_channels(
    model: onnx.ModelProto,
    groups: list[Group],
    scales: Mapping[str, np.ndarray],
    *,
    replaced: Set[str] = frozenset(),
    read: Callable[[onnx.TensorProto], np.ndarray] = numpy_helper.to_array,
) -> onnx.ModelProto:
    """A copy of ``model`` with each group's W_j ← s_j · W_j and X ÷ s absorbed or a Mul by 1/s inserted
    (module docstring); ``scales``: group input → (C,) s, C X's channels on the group's axis. The groups'
    rescalings commute (each s multiplies constants of its own), so they may come from the original model's
    values. ``replaced``: initializers left as they are, because the caller replaces them with values it
    rescaled itself (a weight-only export's quantized weights); ``read``: an initializer's value (the
    model's external data may still be in its file)."""
    graph = model.graph
    index = GraphIndex(graph)
    nodes = {node.name: node for node in graph.node}
    positions = {node.name: i for i, node in enumerate(graph.node)}
    values: dict[str, np.ndarray] = {}  # initializer → its float64 value as rescaled so far

    def value(name: str) -> np.ndarray:
        return values[name] if name in values else read(index.initializers[name]).astype(np.float64)

    def rescale(name: str, factor: np.ndarray) -> None:
        if name not in replaced:
            values[name] = value(name) * factor  # broadcast as ONNX would

    scaled = onnx.ModelProto()
    scaled.CopyFrom(model)
    scope = NameScope(index.used_names())
    inserted: list[tuple[int, onnx.NodeProto]] = []  # (position of the group's first layer, its Mul)
    value_infos = {v.name: v for v in [*graph.input, *graph.value_info]}
    for group in groups:
        scale = np.asarray(scales[group.input], dtype=np.float64)
        for layer in group.layers:  # W_j ← s_j · W_j
            node = nodes[layer]
            rescale(node.input[1], _weight_factor(node, tuple(index.initializers[node.input[1]].dims), scale))
        if group.absorbed is not None:
            for name, position in group.absorbed:
                rescale(name, (1.0 / scale).reshape(-1, *([1] * (-position - 1))))
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
