"""Static checks of TensorRT's explicit-quantization rules on a QDQ ONNX model; no GPU needed.

TensorRT builds a Q/DQ network as a strongly typed network and honours every QuantizeLinear (Q) and
DequantizeLinear (DQ) as written ("Working with Quantized Types", TensorRT 10/11). What it can *fuse*
into integer kernels, and what its ONNX parser accepts at all, follows rules that a model can break
silently: the engine then builds but runs a layer in float, or the parser refuses the model on the GPU
worker long after the job was accepted. Each rule below is a function over the graph; ``RULES`` maps
its name to it (the registry is data, ``check_qdq`` runs them all). A violation is a ``Finding``:
``{rule, node, tensor, message, severity}``, JSON-ready for the report.

Severity: ``error`` — TensorRT refuses the model or computes something else than the QDQ model
says; ``warning`` — it builds and matches, but the Q/DQ cannot be fused (the layer runs in float and
the pair only adds latency and rounding error).

Rules (Q/DQ with scale s and zero point o: q = clip(round(x / s) + o), x̂ = (q - o) · s):

- ``q_dq_pair`` (error): every Q output is read by DequantizeLinear nodes only (an int8 tensor
  reaching a float op, or a graph output, is not a quantized network TensorRT can run).
- ``storage_type`` (error): Q/DQ types TensorRT has: int8, float8e4m3fn; int4 and float4e2m1 on
  DQ only. uint8 (ONNX's default when Q has no zero point), uint4, int16, int32 (ONNX Runtime's bias
  DQ), float8e5m2 are refused by its parser.
- ``zero_offset`` (error): TensorRT quantization is symmetric: every zero point must be 0.
- ``scale`` (error): scales are build-time constants (initializer or Constant), finite and > 0.
- ``activation_granularity`` (error): Q on an activation is per-tensor (a scalar scale); per-channel
  and block scales are for weights.
- ``weight_axis`` (error): a per-channel weight DQ uses the consumer's output-channel axis
  (K): Conv W (K, C/g, kH, kW) axis 0; ConvTranspose W (C, K/g, kH, kW) axis 1; Gemm B axis 0 with
  transB=1, 1 without; MatMul B (…, K_in, N) its last axis; and carries one scale per channel.
- ``int4_weight_only`` (error): INT4 is weight-only in TensorRT: no Q to int4, int4 DQ only on
  constants; block quantization (scale of the weight's rank) only on 2-D weights, blocked on one axis.
- ``pair_mismatch`` (warning): a Q and the DQ reading it use the same scale, zero point and axis;
  otherwise the pair is a requantization TensorRT runs as two standalone layers.
- ``unfusable`` (warning): the DQ output of an activation pair must reach (possibly through ops
  TensorRT commutes Q/DQ across: Reshape, Transpose, MaxPool, Slice, ...) at least one op TensorRT
  runs in INT8 (Conv, ConvTranspose, Gemm, MatMul, element-wise Add/Mul/Sub, Concat, pooling).
  A DQ reaching another Q is a requantization, which TensorRT also runs in int8. Q/DQ in front of
  ops it keeps in float (Softmax, LayerNormalization, Sigmoid, ...) or at a graph output is never
  fused.
- ``partial_inputs`` (warning): TensorRT recommends quantizing *all* inputs of a weighted op
  (Conv/ConvTranspose/Gemm/MatMul) and both inputs of a residual Add; with only one side quantized the
  op runs in float (INT4 weight-only DQ excepted, which TensorRT fuses with float activations; and an
  Add whose float input is the only output of a weighted layer, which TensorRT fuses the sum into, so
  that only the residual input carries Q/DQ).

Scope: the main graph; Q/DQ inside If/Loop bodies are not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore.annotate.rules import fusing_producer
from quantcore.graph.index import GraphIndex
from quantcore.graph.ops import DATA_MOVEMENT_OPS

SEVERITIES = ("error", "warning")

Q, DQ = "QuantizeLinear", "DequantizeLinear"
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops TensorRT runs on INT8 inputs when a DQ feeds them (weighted ops, element-wise, concat, pooling).
INT8_OPS = frozenset(
    {*WEIGHTED_OPS, "Add", "Sub", "Mul", "Concat", "AveragePool", "GlobalAveragePool", "MaxPool", "GlobalMaxPool"}
)
# What a DQ may reach and still fuse: an INT8 op, or a Q (DQ → Q is an int8 requantization).
FUSING_READERS = INT8_OPS | {Q}
# Ops TensorRT moves Q/DQ across ("commuting" data-movement ops): a DQ in front of them acts on what follows.
COMMUTING_OPS = DATA_MOVEMENT_OPS | {"GlobalMaxPool"}
RESIDUAL_OPS = ("Add",)
ACTIVATION_TYPES = frozenset({TensorProto.INT8, TensorProto.FLOAT8E4M3FN})
WEIGHT_ONLY_TYPES = frozenset({TensorProto.INT4, TensorProto.FLOAT4E2M1})
FOUR_BIT_TYPES = WEIGHT_ONLY_TYPES
MAX_WALK = 64  # longest chain of commuting ops followed back from a weighted op's input


@dataclass(frozen=True)
class Finding:
    """One violated rule: which rule, at which node and tensor, why, and how bad."""

    rule: str
    node: str
    tensor: str
    message: str
    severity: str

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {sorted(RULES)}, got {self.rule!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        for field in ("node", "tensor", "message"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(f"{field} must be a string, got {getattr(self, field)!r}")

    def to_dict(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "node": self.node,
            "tensor": self.tensor,
            "message": self.message,
            "severity": self.severity,
        }


class QdqGraph:
    """The facts every rule needs: constants (initializers and Constant outputs), producers,
    consumers, and the Q/DQ nodes of the main graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.index = GraphIndex(model.graph)
        self.quantize = [n for n in model.graph.node if n.op_type == Q]
        self.dequantize = [n for n in model.graph.node if n.op_type == DQ]
        self._constants: dict[str, np.ndarray | None] = {}

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or Constant node), else None."""
        if not name:
            return None
        if name not in self._constants:
            value = None
            if name in self.index.initializers:
                value = numpy_helper.to_array(self.index.initializers[name])
            else:
                producer = self.index.producers.get(name)
                if producer is not None and producer.op_type == "Constant":
                    for attribute in producer.attribute:
                        if attribute.name == "value":
                            value = numpy_helper.to_array(attribute.t)
            self._constants[name] = value
        return self._constants[name]

    def consumers(self, name: str) -> list[tuple[onnx.NodeProto, int]]:
        return list(self.index.consumers.get(name, []))

    def elem_type(self, name: str) -> int | None:
        if name in self.index.initializers:
            return self.index.initializers[name].data_type
        producer = self.index.producers.get(name)
        if producer is not None and producer.op_type == "Constant":
            for attribute in producer.attribute:
                if attribute.name == "value":
                    return attribute.t.data_type
        if producer is not None and producer.op_type == Q:
            return self.quant_type(producer)
        return self.index.elem_types.get(name)

    def quant_type(self, node: onnx.NodeProto) -> int | None:
        """The integer/float8 type a Q produces or a DQ reads: the zero point's type, else Q's
        ``output_dtype`` attribute, else ONNX's default (uint8) for Q and the input's type for DQ."""
        if len(node.input) > 2 and node.input[2]:
            zero_type = self.elem_type(node.input[2])
            if zero_type is not None:
                return zero_type
        if node.op_type == Q:
            output_dtype = attribute(node, "output_dtype", 0)
            return int(output_dtype) if output_dtype else TensorProto.UINT8
        return self.elem_type(node.input[0])

    def is_weight(self, node: onnx.NodeProto) -> bool:
        """A DQ of a constant (pre-quantized weight), or of a Q whose input is a constant."""
        source = node.input[0]
        producer = self.index.producers.get(source)
        if producer is not None and producer.op_type == Q:
            source = producer.input[0]
        return self.constant(source) is not None

    def reached_ops(self, tensor: str) -> Iterator[tuple[onnx.NodeProto, int] | None]:
        """Consumers of ``tensor`` after following commuting ops; None stands for a graph output."""
        frontier, seen = [tensor], set()
        while frontier:  # finite: each tensor is visited once
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.index.graph_outputs:
                yield None
            for node, position in self.consumers(name):
                if node.op_type in COMMUTING_OPS and position == 0:
                    frontier.extend(o for o in node.output if o)
                else:
                    yield node, position

    def dequantized_by(self, tensor: str) -> onnx.NodeProto | None:
        """The DQ whose output reaches ``tensor`` backwards through single-input commuting ops."""
        for _ in range(MAX_WALK):
            producer = self.index.producers.get(tensor)
            if producer is None:
                return None
            if producer.op_type == DQ:
                return producer
            if producer.op_type not in COMMUTING_OPS:
                return None
            tensor = producer.input[0]
        return None


def attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def type_name(elem_type: int | None) -> str:
    return "unknown" if elem_type is None else TensorProto.DataType.Name(elem_type).lower()


def _finding(rule: str, node: onnx.NodeProto, tensor: str, message: str) -> Finding:
    return Finding(rule=rule, node=node.name or node.op_type, tensor=tensor, message=message, severity=SEVERITY[rule])


def _granularity(scale: np.ndarray | None) -> str:
    if scale is None or scale.ndim == 0 or (scale.size == 1 and scale.ndim <= 1):
        return "per-tensor"
    return "per-channel" if scale.ndim == 1 else "block"


def check_q_dq_pair(graph: QdqGraph) -> Iterator[Finding]:
    for node in graph.quantize:
        out = node.output[0]
        readers = graph.consumers(out)
        not_dq = sorted({n.name or n.op_type for n, _ in readers if n.op_type != DQ})
        if not_dq:
            yield _finding(
                "q_dq_pair",
                node,
                out,
                f"QuantizeLinear output {out!r} is read by {not_dq}, not by a "
                "DequantizeLinear; TensorRT expects every Q to be followed by DQ",
            )
        elif out in graph.index.graph_outputs or not readers:
            yield _finding(
                "q_dq_pair",
                node,
                out,
                f"QuantizeLinear output {out!r} is not dequantized (it is a graph "
                "output or unused); TensorRT expects every Q to be followed by DQ",
            )


def check_storage_type(graph: QdqGraph) -> Iterator[Finding]:
    for node in [*graph.quantize, *graph.dequantize]:
        elem_type = graph.quant_type(node)
        allowed = ACTIVATION_TYPES | (WEIGHT_ONLY_TYPES if node.op_type == DQ else frozenset())
        if elem_type is not None and elem_type not in allowed:
            names = sorted(type_name(t) for t in allowed)
            yield _finding(
                "storage_type",
                node,
                node.input[0],
                f"{node.op_type} uses {type_name(elem_type)}; TensorRT "
                f"supports {', '.join(names)} here (symmetric INT8 needs an int8 zero point)",
            )


def check_zero_offset(graph: QdqGraph) -> Iterator[Finding]:
    for node in [*graph.quantize, *graph.dequantize]:
        if len(node.input) < 3 or not node.input[2]:
            continue
        zero = graph.constant(node.input[2])
        if zero is None:
            yield _finding("zero_offset", node, node.input[2], f"zero point {node.input[2]!r} is not a constant")
        elif np.any(zero.astype(np.float64) != 0):
            yield _finding(
                "zero_offset",
                node,
                node.input[2],
                f"zero point {node.input[2]!r} has non-zero values "
                f"(max |o| = {float(np.abs(zero.astype(np.float64)).max()):g}); TensorRT quantization is "
                "symmetric and needs offset 0",
            )


def check_scale(graph: QdqGraph) -> Iterator[Finding]:
    for node in [*graph.quantize, *graph.dequantize]:
        scale = graph.constant(node.input[1])
        if scale is None:
            yield _finding("scale", node, node.input[1], f"scale {node.input[1]!r} is not a build-time constant")
            continue
        values = scale.astype(np.float64)
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            yield _finding(
                "scale",
                node,
                node.input[1],
                f"scale {node.input[1]!r} has {int(bad.sum())} value(s) that "
                f"are not finite and positive (e.g. {values[bad].ravel()[0]!r})",
            )


def check_activation_granularity(graph: QdqGraph) -> Iterator[Finding]:
    for node in graph.quantize:
        if graph.constant(node.input[0]) is not None:
            continue  # Q of a float weight: TensorRT quantizes it at build time
        granularity = _granularity(graph.constant(node.input[1]))
        if granularity != "per-tensor":
            yield _finding(
                "activation_granularity",
                node,
                node.input[0],
                f"activation {node.input[0]!r} is quantized "
                f"{granularity}; TensorRT quantizes activations per-tensor (scalar scale)",
            )


def expected_weight_axis(consumer: onnx.NodeProto, position: int, rank: int) -> int | None:
    """The output-channel axis (K) of a weight read by ``consumer`` at input ``position``; None if the
    input is not a weight of a weighted op."""
    if position != 1:
        return None
    if consumer.op_type == "Conv":
        return 0
    if consumer.op_type == "ConvTranspose":
        return 1
    if consumer.op_type == "Gemm":
        return 0 if attribute(consumer, "transB", 0) else 1
    if consumer.op_type == "MatMul":
        return rank - 1
    return None


def check_weight_axis(graph: QdqGraph) -> Iterator[Finding]:
    for node in graph.dequantize:
        if not graph.is_weight(node):
            continue
        scale = graph.constant(node.input[1])
        if _granularity(scale) != "per-channel":
            continue
        source = graph.constant(node.input[0])
        if source is None:  # Q(W) → DQ: the float weight is Q's input
            source = graph.constant(graph.index.producers[node.input[0]].input[0])
        rank = source.ndim
        axis = int(attribute(node, "axis", 1))
        axis = axis + rank if axis < 0 else axis
        for consumer, position in graph.consumers(node.output[0]):
            expected = expected_weight_axis(consumer, position, rank)
            if expected is None:
                continue
            where = f"{consumer.op_type} {consumer.name!r}"
            if consumer.op_type == "MatMul" and rank != 2:
                yield _finding(
                    "weight_axis",
                    node,
                    node.input[0],
                    f"per-channel weight of rank {rank} for {where}; "
                    "TensorRT quantizes MatMul weights per-channel only for 2-D matrices",
                )
            elif axis != expected:
                yield _finding(
                    "weight_axis",
                    node,
                    node.input[0],
                    f"per-channel weight DQ uses axis {axis}; the output-channel axis of {where} is {expected}",
                )
            elif scale.size != source.shape[axis]:
                yield _finding(
                    "weight_axis",
                    node,
                    node.input[0],
                    f"{scale.size} scales for {source.shape[axis]} output channels (axis {axis}) of {where}",
                )


def check_int4_weight_only(graph: QdqGraph) -> Iterator[Finding]:
    for node in graph.quantize:
        elem_type = graph.quant_type(node)
        if elem_type in FOUR_BIT_TYPES and graph.constant(node.input[0]) is None:
            yield _finding(
                "int4_weight_only",
                node,
                node.input[0],
                f"activation {node.input[0]!r} is quantized to "
                f"{type_name(elem_type)}; TensorRT uses 4-bit types for weights only",
            )
    for node in graph.dequantize:
        elem_type = graph.quant_type(node)
        if elem_type not in FOUR_BIT_TYPES:
            continue
        if not graph.is_weight(node):
            yield _finding(
                "int4_weight_only",
                node,
                node.input[0],
                f"{type_name(elem_type)} DQ of non-constant "
                f"{node.input[0]!r}; TensorRT reads 4-bit types from constant weights only",
            )
            continue
        scale = graph.constant(node.input[1])
        if _granularity(scale) == "block":
            weight = graph.constant(node.input[0])
            shape = () if weight is None else weight.shape
            blocked = [a for a, (n, s) in enumerate(zip(shape, scale.shape, strict=False)) if s != n]
            if len(shape) != 2 or len(blocked) != 1:
                yield _finding(
                    "int4_weight_only",
                    node,
                    node.input[0],
                    f"block-quantized weight of shape "
                    f"{tuple(shape)} with scales {scale.shape}; TensorRT blocks 2-D weights on one axis",
                )


def check_pair_mismatch(graph: QdqGraph) -> Iterator[Finding]:
    for q in graph.quantize:
        for dq, _ in graph.consumers(q.output[0]):
            if dq.op_type != DQ:
                continue
            differences = []
            for label, position in (("scale", 1), ("zero point", 2)):
                a = graph.constant(q.input[position]) if len(q.input) > position else None
                b = graph.constant(dq.input[position]) if len(dq.input) > position else None
                same = (a is None and b is None) or (
                    a is not None
                    and b is not None
                    and a.shape == b.shape
                    and np.array_equal(a.astype(np.float64), b.astype(np.float64))
                )
                if not same:
                    differences.append(label)
            if (
                attribute(q, "axis", 1) != attribute(dq, "axis", 1)
                and _granularity(graph.constant(q.input[1])) != "per-tensor"
            ):
                differences.append("axis")
            if differences:
                yield _finding(
                    "pair_mismatch",
                    dq,
                    q.output[0],
                    f"Q {q.name!r} and DQ {dq.name!r} differ in "
                    f"{' and '.join(differences)}; TensorRT runs the pair as a requantization, unfused",
                )


def check_unfusable(graph: QdqGraph) -> Iterator[Finding]:
    for dq in graph.dequantize:
        if graph.is_weight(dq):
            continue
        reached = list(graph.reached_ops(dq.output[0]))
        if any(item is not None and item[0].op_type in FUSING_READERS for item in reached):
            continue
        targets = sorted(
            {"graph output" if item is None else f"{item[0].op_type} {item[0].name!r}" for item in reached}
        )
        yield _finding(
            "unfusable",
            dq,
            dq.output[0],
            f"dequantized {dq.output[0]!r} reaches only "
            f"{', '.join(targets) or 'nothing'}, which TensorRT runs in float; the Q/DQ pair cannot be "
            "fused and only adds latency and rounding error",
        )


def _fused_weighted_output(graph: QdqGraph, name: str) -> bool:
    """``name`` comes from a weighted layer with a (dequantized) weight that TensorRT fuses its only
    reader's element-wise sum into (``quantcore.annotate.rules.fusing_producer``)."""
    producer = fusing_producer(name, graph.index)
    if producer is None:
        return False
    weight = producer.input[1]
    dq = graph.index.producers.get(weight)
    return graph.constant(weight) is not None or (dq is not None and dq.op_type == DQ and graph.is_weight(dq))


def check_partial_inputs(graph: QdqGraph) -> Iterator[Finding]:
    for node in graph.model.graph.node:
        if node.op_type in WEIGHTED_OPS:
            inputs = [(i, name) for i, name in enumerate(node.input[:2]) if name]
        elif node.op_type in RESIDUAL_OPS:
            inputs = [(i, name) for i, name in enumerate(node.input) if name and graph.constant(name) is None]
        else:
            continue
        if len(inputs) < 2:
            continue
        sources = {name: graph.dequantized_by(name) for _, name in inputs}
        quantized = [name for name, dq in sources.items() if dq is not None]
        if not quantized or len(quantized) == len(sources):
            continue
        weight_only = node.op_type in ("Gemm", "MatMul") and all(
            graph.quant_type(sources[name]) in FOUR_BIT_TYPES for name in quantized
        )
        if weight_only:
            continue
        floats = [name for name in sources if sources[name] is None]
        if node.op_type in RESIDUAL_OPS and len(floats) == 1 and _fused_weighted_output(graph, floats[0]):
            continue  # the sum fuses into the weighted layer writing it; only the residual needs Q/DQ
        yield _finding(
            "partial_inputs",
            node,
            floats[0],
            f"{node.op_type} {node.name!r} has dequantized input(s) "
            f"{quantized} but float input(s) {floats}; TensorRT runs it in float unless all inputs are "
            "quantized",
        )


Rule = Callable[[QdqGraph], Iterator[Finding]]
RULES: dict[str, Rule] = {
    "q_dq_pair": check_q_dq_pair,
    "storage_type": check_storage_type,
    "zero_offset": check_zero_offset,
    "scale": check_scale,
    "activation_granularity": check_activation_granularity,
    "weight_axis": check_weight_axis,
    "int4_weight_only": check_int4_weight_only,
    "pair_mismatch": check_pair_mismatch,
    "unfusable": check_unfusable,
    "partial_inputs": check_partial_inputs,
}
SEVERITY: dict[str, str] = {
    "q_dq_pair": "error",
    "storage_type": "error",
    "zero_offset": "error",
    "scale": "error",
    "activation_granularity": "error",
    "weight_axis": "error",
    "int4_weight_only": "error",
    "pair_mismatch": "warning",
    "unfusable": "warning",
    "partial_inputs": "warning",
}


def check_qdq(model: onnx.ModelProto | str) -> list[Finding]:
    """Every finding of every rule on ``model`` (a ModelProto or a path), errors first.

    External data must be loadable (a path loads it). A model without Q/DQ yields no findings.
    """
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    graph = QdqGraph(model)
    findings = [finding for rule in RULES.values() for finding in rule(graph)]
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.rule, f.node))


def summarize(findings: list[Finding]) -> dict[str, Any]:
    """Report section: counts per severity and the findings as dicts."""
    return {
        "errors": sum(1 for f in findings if f.severity == "error"),
        "warnings": sum(1 for f in findings if f.severity == "warning"),
        "findings": [f.to_dict() for f in findings],
    }
