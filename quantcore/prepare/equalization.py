"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization and
Bias Correction", section 4.1) of the prepared FP32 graph: the same function, with the ranges of
consecutive layers' channels made equal so that per-tensor quantization of the activation between them
(and of either weight) loses less.

A pair is Conv → [Relu | LeakyRelu | PRelu] → Conv, or Gemm → [...] → Gemm, where the first layer's
output (and the activation's) is read by that one node only and is no graph output, both weights (and
the first's bias) are float32 initializers read by that node only, and the second reads the tensor as
its data input. For each channel i of the tensor between them (the first's output channel, the
second's input channel):

    r1_i = max |W1[i, ...]|                   (over the first's output channel i)
    r2_i = max |W2[:, i, ...]|                (over every weight the second applies to input channel i)
    s_i  = sqrt(r1_i · r2_i) / r2_i           (so that both become sqrt(r1_i · r2_i))
    W1_i /= s_i,  b1_i /= s_i,  W2[:, i] *= s_i

This is exact because every activation allowed between them is positively homogeneous per channel,
f(x / s) = f(x) / s for s > 0 (PRelu for any constant slope, per channel or not: the slope multiplies
x / s as it multiplies x). Clip and Relu6 (and any other bounded activation) are not: a pair through
them is not equalized. A channel with r1_i = 0 or r2_i = 0 keeps s_i = 1 (nothing to balance).

Grouped and depthwise layers take part: a grouped second layer applies input channel i through
W2[group(i) · C_out/g : (group(i) + 1) · C_out/g, i mod C_in/g]; a depthwise second layer's input
channel i is also its output channel i, so its scale changes the range that the pair after it
equalizes. As in the paper, pairs sharing a layer (conv → depthwise → conv) are swept in graph order
again and again until no scale moves by more than ``TOLERANCE`` (or ``MAX_ROUNDS`` sweeps).

Not done: ConvTranspose (its weight is (C_in, C_out/g, ...)), pairs with a reshape between them, bias
absorption (it needs each channel's pre-activation lower bound; the folded BatchNorm's statistics are
gone by now).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.graph.index import GraphIndex
from quantcore.prepare.preparation import PreparedModel
from quantcore.wording import counted

HOMOGENEOUS_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "PRelu"})  # f(x / s) = f(x) / s for s > 0
LAYERS = frozenset({"Conv", "Gemm"})
MAX_ROUNDS = 100
TOLERANCE = 1e-4  # |s_i - 1| of every channel in a sweep below this: the scales have settled


@dataclass(frozen=True)
class EqualizedPair:
    first: str  # node names
    second: str
    activation: str | None  # the node between them, if any


@dataclass(frozen=True)
class Equalization:
    """What ``equalize`` did: the pairs rescaled, the sweeps it took, and the largest |log s_i| of
    the composed scales (how far the model was from equalized)."""

    pairs: tuple[EqualizedPair, ...]
    rounds: int
    max_log_scale: float

    def summary(self) -> dict[str, Any]:
        """JSON-ready, the report's ``prepare.equalization``."""
        return {
            "pairs": [{"first": p.first, "second": p.second, "activation": p.activation} for p in self.pairs],
            "sweeps": self.rounds,
            "max_log_scale": self.max_log_scale,
        }

    def statement(self) -> str:
        if not self.pairs:
            return "equalization: no layer pair to equalize"
        return f"equalized {counted(len(self.pairs), 'layer pair')} in {counted(self.rounds, 'sweep')}"


class _Layer:
    """A Conv or Gemm's weight and bias as float64 arrays laid out (C_out, C_in/g, ...), with the
    node's group count; written back in the node's own layout by ``arrays``."""

    def __init__(self, node: onnx.NodeProto, index: GraphIndex) -> None:
        self.node = node
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        self.transposed = node.op_type == "Gemm" and not attributes.get("transB", 0)  # Gemm B is (K, N)
        weight = index.array(node.input[1]).astype(np.float64)
        self.weight = weight.T if self.transposed else weight  # (C_out, C_in/g, ...)
        self.groups = int(attributes.get("group", 1))
        self.bias = index.array(node.input[2]).astype(np.float64) if len(node.input) > 2 and node.input[2] else None

    def output_ranges(self) -> np.ndarray:
        """(C_out,) r1: max |W| of each output channel."""
        return np.abs(self.weight).reshape(self.weight.shape[0], -1).max(axis=1)

    def _input_view(self) -> np.ndarray:
        """(C_in, C_out/g, k...) view-by-copy: for each input channel, the weights that read it."""
        c_out, per_group = self.weight.shape[:2]
        outputs_per_group = c_out // self.groups
        grouped = self.weight.reshape(self.groups, outputs_per_group, per_group, *self.weight.shape[2:])
        return np.moveaxis(grouped, 2, 1).reshape(self.groups * per_group, outputs_per_group, *self.weight.shape[2:])

    def input_ranges(self) -> np.ndarray:
        """(C_in,) r2: max |W| over the weights each input channel is multiplied by."""
        view = self._input_view()
        return np.abs(view).reshape(view.shape[0], -1).max(axis=1)

    def scale_outputs(self, divisor: np.ndarray) -> None:
        """W_i /= s_i and b_i /= s_i for each output channel i."""
        self.weight = self.weight / divisor.reshape(-1, *([1] * (self.weight.ndim - 1)))
        if self.bias is not None:
            self.bias = (self.bias.reshape(-1) / divisor).reshape(self.bias.shape)

    def scale_inputs(self, factor: np.ndarray) -> None:
        """W[:, i] *= s_i for each input channel i (within its group)."""
        c_out, per_group = self.weight.shape[:2]
        per_input = factor.reshape(self.groups, 1, per_group)  # (g, 1, C_in/g) against (g, C_out/g, C_in/g)
        grouped = self.weight.reshape(self.groups, c_out // self.groups, per_group, -1)
        self.weight = (grouped * per_input[..., None]).reshape(self.weight.shape)

    def arrays(self) -> dict[str, np.ndarray]:
        """Initializer name → its new float32 value."""
        weight = self.weight.T if self.transposed else self.weight
        arrays = {self.node.input[1]: weight.astype(np.float32)}
        if self.bias is not None:
            arrays[self.node.input[2]] = self.bias.astype(np.float32)
        return arrays


def _only_reader(index: GraphIndex, tensor: str) -> onnx.NodeProto | None:
    """The single node reading ``tensor`` as a real input, when there is exactly one and it is no graph output."""
    readers = index.consumers.get(tensor, [])
    if len(readers) != 1 or tensor in index.graph_outputs or readers[0][1] < 0:
        return None
    return readers[0][0]


def _is_layer(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """A Conv/Gemm whose weight (and bias) are float32 initializers read by it alone; Gemm: no transA,
    a bias (if any) of one value per output channel."""
    if node.op_type not in LAYERS or len(node.input) < 2:
        return False
    constants = [name for name in node.input[1:3] if name]
    if not all(
        index.is_initializer(name) and index.is_float32(name, unknown=False) and len(index.consumers[name]) == 1
        for name in constants
    ):
        return False
    if node.op_type == "Gemm":
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("transA", 0):
            return False
        if len(node.input) > 2 and node.input[2]:
            weight, bias = index.initializers[node.input[1]], index.initializers[node.input[2]]
            outputs = weight.dims[0] if attributes.get("transB", 0) else weight.dims[1]
            if int(np.prod(bias.dims)) != outputs or (len(bias.dims) == 2 and bias.dims[0] != 1):
                return False  # a scalar or (M, N) bias broadcasts over rows, not one value per channel
    return True


def find_pairs(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto | None]]:
    """(first, second, activation or None) for every equalizable pair (module docstring), in graph order."""
    index = GraphIndex(graph)
    pairs = []
    for first in graph.node:
        if not _is_layer(first, index):
            continue
        reader = _only_reader(index, first.output[0])
        activation = None
        if reader is not None and reader.op_type in HOMOGENEOUS_ACTIVATIONS:
            if reader.op_type == "PRelu" and not index.is_constant(reader.input[1]):
                continue  # a slope computed at run time might depend on the scale
            activation, reader = reader, _only_reader(index, reader.output[0])
        if reader is None or reader.op_type != first.op_type or not _is_layer(reader, index):
            continue
        if reader.input[0] != (activation or first).output[0]:
            continue  # the tensor is the second's weight, not its data
        pairs.append((first, reader, activation))
    return pairs


def equalize(prepared: PreparedModel) -> tuple[PreparedModel, Equalization]:
    """``prepared`` with every pair of ``find_pairs`` equalized (module docstring), in a copy of its model;
    the same function in exact arithmetic, to float32 rounding of the rescaled weights in practice.
    Returns ``prepared`` itself when there is no pair."""
    pairs = find_pairs(prepared.model.graph)
    if not pairs:
        return prepared, Equalization((), 0, 0.0)
    index = GraphIndex(prepared.model.graph)
    layers: dict[str, _Layer] = {}
    for first, second, _ in pairs:
        for node in (first, second):
            layers.setdefault(node.name, _Layer(node, index))
    composed = {first.name: np.ones(layers[first.name].weight.shape[0]) for first, _, _ in pairs}
    rounds = 0
    while rounds < MAX_ROUNDS:
        rounds += 1
        largest = 0.0
        for first, second, _ in pairs:
            r1, r2 = layers[first.name].output_ranges(), layers[second.name].input_ranges()
            live = (r1 > 0) & (r2 > 0)
            scale = np.ones_like(r1)
            scale[live] = np.sqrt(r1[live] * r2[live]) / r2[live]
            layers[first.name].scale_outputs(scale)
            layers[second.name].scale_inputs(scale)
            composed[first.name] *= scale
            largest = max(largest, float(np.max(np.abs(scale - 1.0))))
        if largest < TOLERANCE:
            break
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    values = {name: array for layer in layers.values() for name, array in layer.arrays().items()}
    for tensor in model.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name], tensor.name))
    equalized = tuple(EqualizedPair(f.name, s.name, a.name if a is not None else None) for f, s, a in pairs)
    max_log = max(float(np.max(np.abs(np.log(s)))) for s in composed.values())
    return replace(prepared, model=model), Equalization(equalized, rounds, max_log)
