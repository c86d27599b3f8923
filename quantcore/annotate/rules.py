"""The vocabulary of platform rule sets: a rule looks at one node and says which of its tensors to
quantize and how.

A platform is data: ``Platform(rules={"Conv": quantize_compute, ...}, weight=..., activation=...)``,
looked up with ``platform.rule_for(node)`` = ``rules.get(op_type, keep_float)``: an op no rule names
stays float. Rules are pure functions of the node and a ``RuleContext`` (graph index, run config,
the platform's presets at the bits resolved for this node, and what annotation decided so far);
they never edit the graph.

A rule returns requests:

- ``QuantRequest(i, tqc)``: Q/DQ in front of input ``i`` (only this node reads the dequantized value);
- ``QuantRequest(i, tqc, output=True)``: Q/DQ after output ``i``, read by every consumer that is not
  excluded (how ONNX Runtime's CPU EP sees where an integer kernel's result is requantized);
- ``BiasRequest(i, activation, weight)``: input ``i`` (a bias) stored as int32 with
  s_b = s_activation · s_weight[c], offset 0 (what QLinearConv/QGemm consume).

The rule families shared by every platform live here (the op families they act on: ``quantcore.graph.ops``);
a platform module picks, per op type, which family rule applies and with which presets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from quantcore.graph.index import SUBGRAPH_INPUT, GraphIndex
from quantcore.graph.ops import COMPUTE_OPS
from quantcore.numerics.tqc import TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import PlatformName, QuantizeConfig


@dataclass(frozen=True)
class QuantRequest:
    """Quantize input ``index`` of the node (or output ``index`` when ``output``) with ``config``."""

    index: int
    config: TensorQuantConfig
    output: bool = False


@dataclass(frozen=True)
class BiasRequest:
    """Input ``index`` is a bias: int32 codes with scale s_x · s_w, where x is input
    ``activation_index`` and w is input ``weight_index`` (both must end up quantized)."""

    index: int
    activation_index: int = 0
    weight_index: int = 1


@dataclass(frozen=True)
class FloatReason:
    """The rule keeps the node float on purpose: ``reason`` becomes its decision's reason (the rule
    returns it alone)."""

    reason: str


Request = QuantRequest | BiasRequest | FloatReason

# (axis or None, bits, run config) -> weight TQC;  (bits, observer, run config) -> activation TQC
WeightPreset = Callable[[int | None, int, "QuantizeConfig"], TensorQuantConfig]
ActivationPreset = Callable[[int, str, "QuantizeConfig"], TensorQuantConfig]


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at for one node.

    weight_bits / activation_bits / observer: already resolved for this node (precision, platform
    boundary layers, user overrides). ``annotated(t)`` / ``config_of(t)``: whether / how an earlier node annotated t.
    ``decision_of(node)``: the decision taken for an earlier node (None if not yet visited).
    ``excluded(node)``: the user keeps that node in float.
    """

    index: GraphIndex
    config: QuantizeConfig
    weight_preset: WeightPreset
    activation_preset: ActivationPreset
    weight_bits: int
    activation_bits: int
    observer: str
    annotated: Callable[[str], bool]
    config_of: Callable[[str], TensorQuantConfig | None]
    decision_of: Callable[[str], str | None]
    excluded: Callable[[onnx.NodeProto], bool]

    def weight(self, axis: int | None) -> TensorQuantConfig:
        return self.weight_preset(axis, self.weight_bits, self.config)

    def activation(self, *, dominator: str | None = None) -> TensorQuantConfig:
        tqc = self.activation_preset(self.activation_bits, self.observer, self.config)
        return tqc if dominator is None else replace(tqc, dominator=dominator)


Rule = Callable[[onnx.NodeProto, RuleContext], list[Request]]
ReaderTest = Callable[[onnx.NodeProto, int], bool]  # (a reader, the input position it reads the tensor at)


def reaches_reader(name: str, context: RuleContext, takes: ReaderTest, passes_on: ReaderTest) -> bool:
    """Whether a reader of ``name`` that the user did not exclude ``takes`` it, directly or behind readers
    that pass it on (``passes_on``: their outputs are followed in turn); each tensor is looked at once.
    The platforms ask it whether a tensor ends up read by an integer kernel."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        tensor = pending.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, position in context.index.consumers.get(tensor, []):
            if position == SUBGRAPH_INPUT or context.excluded(node):
                continue
            if takes(node, position):
                return True
            if passes_on(node, position):
                pending.extend(output for output in node.output if output)
    return False


def keep_float(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Default rule: the node runs in float, no tensor is quantized."""
    return []


def pass_through(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Identity-like ops (Relu, Reshape, MaxPool, ...): no Q/DQ of their own. Quantization placed at a
    consumer further down commutes through them, so the runtime may move it across the op."""
    return []


def attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for entry in node.attribute:
        if entry.name == name:
            return int(helper.get_attribute_value(entry))
    return default


def weight_axis(node: onnx.NodeProto, index: GraphIndex) -> int | None:
    """Output-channel axis of the node's weight operand (input 1), None for per-tensor.

    Conv W (C_out, C_in/g, k...) axis 0 (depthwise/grouped too); ConvTranspose W (C_in, C_out/g, k...)
    axis 1; Gemm B (N, K) axis 0 with transB=1, (K, N) axis 1 with transB=0; MatMul B (..., K, N) its
    last axis, per-tensor when B is 1-D.
    """
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        return 0 if attribute(node, "transB", 0) else 1
    if node.op_type == "MatMul":
        if len(node.input) > 1 and index.is_initializer(node.input[1]):
            rank = len(index.initializers[node.input[1]].dims)
            return rank - 1 if rank >= 2 else None
        return None
    return 0


def is_float_activation(name: str, index: GraphIndex) -> bool:
    """A non-constant tensor that is float32 (or of unknown type)."""
    return bool(name) and not index.is_constant(name) and index.is_float32(name, unknown=True)


def operand(node: onnx.NodeProto, position: int, context: RuleContext, axis: int | None) -> list[Request]:
    """Request for one operand: a float32 initializer as a weight (per-channel on ``axis``), a float
    activation per-tensor; nothing for absent, constant non-initializer or non-float operands."""
    if len(node.input) <= position or not node.input[position]:
        return []
    name = node.input[position]
    index = context.index
    if index.is_initializer(name):
        return [QuantRequest(position, context.weight(axis))] if index.is_float32(name, unknown=False) else []
    return [QuantRequest(position, context.activation())] if is_float_activation(name, index) else []


def _bias_chain(name: str, index: GraphIndex) -> list[str]:
    """``name``, then while the last tensor's producer is an Add of one constant (a bias), that Add's other
    input: the tensors from ``name`` back to the output of the layer that may write it."""
    chain = [name]
    producer = index.producers.get(name)
    while producer is not None and producer.op_type == "Add" and len(producer.input) == 2:
        variable = [i for i in producer.input if i and not index.is_constant(i)]
        if len(variable) != 1:
            break
        chain.append(variable[0])
        producer = index.producers.get(variable[0])
    return chain


def layer_producer(name: str, index: GraphIndex, *, through: frozenset[str] = frozenset()) -> onnx.NodeProto | None:
    """The Conv/ConvTranspose/Gemm/MatMul writing ``name``, directly or through bias Adds of a constant (as
    exporters write Linear as MatMul + Add) and, before them, ops of ``through`` (on their input 0), or
    None."""
    producer = index.producers.get(_bias_chain(name, index)[-1])
    while producer is not None and producer.op_type in through:
        producer = index.producers.get(producer.input[0])
    return producer if producer is not None and producer.op_type in COMPUTE_OPS and len(producer.input) > 1 else None


def fusing_producer(name: str, index: GraphIndex) -> onnx.NodeProto | None:
    """``layer_producer(name)`` when nothing else reads ``name`` nor the tensors between it and the layer,
    and none is a graph output: the layer TensorRT fuses an element-wise sum reading ``name`` into
    ("quantize the residual input in skip connections"). Whether the layer's input 1 is a weight is the
    caller's check."""
    for tensor in _bias_chain(name, index):
        if tensor in index.graph_outputs or len(index.consumers.get(tensor, [])) != 1:
            return None
    return layer_producer(name, index)


def quantize_compute(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Conv, ConvTranspose, Gemm, MatMul: the data input per-tensor and the weight per-channel on its
    output-channel axis (``weight_axis``); a MatMul whose B is an activation (attention's Q·Kᵀ, P·V)
    gets both operands as per-tensor activations. Biases stay float."""
    return operand(node, 0, context, None) + operand(node, 1, context, weight_axis(node, context.index))


def quantize_elementwise(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Add/Mul of two float32 activations (a residual join, a gate): both inputs per-tensor. A bias
    add (one constant input) or an operand of unknown type stays float."""
    if len(node.input) != 2:
        return []
    for name in node.input:
        if not name or context.index.is_constant(name) or not context.index.is_float32(name, unknown=False):
            return []
    return [QuantRequest(0, context.activation()), QuantRequest(1, context.activation())]


def quantize_shared_inputs(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Concat: every float activation input quantized with ONE scale, that of the first such input
    (the others name it as ``dominator``), so the runtime concatenates integer codes unchanged."""
    positions = [i for i, name in enumerate(node.input) if is_float_activation(name, context.index)]
    if not positions:
        return []
    first = node.input[positions[0]]
    requests: list[Request] = [QuantRequest(positions[0], context.activation())]
    requests += [QuantRequest(i, context.activation(dominator=first)) for i in positions[1:] if node.input[i] != first]
    return requests


def quantize_first_input(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """Pooling (AveragePool, GlobalAveragePool): the input per-tensor, so the pool runs in integer."""
    return operand(node, 0, context, None) if node.input and not context.index.is_initializer(node.input[0]) else []


@dataclass(frozen=True)
class Platform:
    """A named rule set plus its presets.

    rules: op_type → rule; ops absent from ``rules`` (and ops outside the default ONNX domain) use
    ``keep_float``. weight / activation: the TQC presets the rules instantiate. The precisions a
    platform accepts are the run config's (``quantcore.config.PLATFORM_PRECISIONS``, by ``name``), checked
    before any rule runs, so its rules only see precisions it takes. boundary_bits: bits of the first
    and last compute layer (weights and the activation they read), whatever the precision says.
    floating: the platform quantizes to FP8 (``tensorrt-fp8``). notes: statements for the report
    about choices made for this run (e.g. a reduced weight range). unsigned_weights: whether int8
    weight codes are exported as uint8 with zero point + 128 (``Annotation.unsigned_weights``).
    reduced_range_remedy: its weights run on ONNX Runtime's u8s8 kernels, so 7-bit weights
    (``reduce_range="on"``) are the parity check's remedy for a saturating CPU (``quantcore.evaluate.parity``).
    """

    name: PlatformName
    rules: Mapping[str, Rule]
    weight: WeightPreset
    activation: ActivationPreset
    description: str = ""
    boundary_bits: int | None = None
    floating: bool = False
    notes: Callable[[QuantizeConfig], list[str]] = field(default=lambda config: [])
    unsigned_weights: Callable[[QuantizeConfig], bool] = field(default=lambda config: False)
    reduced_range_remedy: bool = False

    def rule_for(self, node: onnx.NodeProto) -> Rule:
        if node.domain not in ("", "ai.onnx"):
            return keep_float
        return self.rules.get(node.op_type, keep_float)
