"""The switched models of the layer-wise analysis (``quantcore.analysis.ranking``).

Two models of the same switch serve every measurement, both the exported QDQ graph
(``quantcore.export.qdq``) with ``mask``, a boolean graph input of one flag per layer k (a layer = a node
reading at least one quantized tensor): every flag off is the FP32 (prepared) model, every flag on the
exported model run as exact Q/DQ, one flag on is "only layer k quantized". No model is rebuilt per layer.

- The *switchable* model (graph-wise runs, as twice over in ``quantcore.analysis.graphwise``) wraps each
  input a layer reads through a DequantizeLinear in ``Where(mask[k], x̂, x)``; both sides are computed on
  every run, and every quantized activation and its dequantized value are graph outputs.
- The *gated* model (layer-wise runs) puts each layer in an ``If`` on its flag: the ``then`` branch
  holds the layer's Q/DQ and the layer reading them, the ``else`` branch the float layer with its
  weights as initializers; only the model's own outputs are outputs. A run computes the Q/DQ of the
  one layer switched on and nothing else, at the cost of FP32 inference (a PaddleOCR recognizer,
  batch 16: 0.54 s of CPU against 0.55 for the FP32 model and 2.6 for the switchable model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore.annotate.annotation import Annotation
from quantcore.export.qdq import build_qdq_model
from quantcore.graph.index import GraphIndex, NameScope, subgraph_references
from quantcore.graph.protobuf import fits_in_protobuf
from quantcore.prepare.preparation import PreparedModel

MASK_INPUT = "quantcore_analysis_mask"


@dataclass(frozen=True)
class Layer:
    """Node ``node`` reading the quantized tensors ``tensors`` (activations and weights)."""

    node: str
    op_type: str
    tensors: tuple[str, ...]


@dataclass(frozen=True)
class SwitchableModel:
    model: onnx.ModelProto
    layers: tuple[Layer, ...]
    dequantized: Mapping[str, str]  # quantized activation -> its DequantizeLinear output
    outputs: tuple[str, ...]  # the model's own outputs


@dataclass(frozen=True)
class _Site:
    """One layer being gated: ``node`` (already rewired by the export) and its ``source`` in the prepared
    graph differ at the inputs ``changed``; ``made`` maps every tensor the export's own nodes produce
    (Clip, QuantizeLinear, DequantizeLinear) to its producer."""

    scope: NameScope
    flag: str
    node: onnx.NodeProto
    source: onnx.NodeProto
    changed: list[int]
    made: Mapping[str, onnx.NodeProto]


# A gate returns the nodes that replace the layer: the layer reading its quantized inputs when the
# flag is on, its float ones when it is off.
Gate = Callable[[_Site], list[onnx.NodeProto]]


def _switched(
    prepared: PreparedModel, annotation: Annotation, gate: Gate
) -> tuple[onnx.ModelProto, list[Layer], list[str]]:
    """The exported graph with every layer's rewired inputs behind ``gate`` on its mask flag, the layers in
    flag order (the graph's node order) and their flag tensors. Float initializers the export replaced by
    codes are put back for the float side."""
    model = build_qdq_model(prepared, annotation)
    graph = model.graph
    original_nodes = {node.name: node for node in prepared.model.graph.node}
    original_initializers = {t.name: t for t in prepared.model.graph.initializer}
    made = {out: n for n in graph.node if n.name not in original_nodes for out in n.output}
    present = {t.name for t in graph.initializer}
    scope = NameScope(GraphIndex(graph).used_names() | {MASK_INPUT})
    layers: list[Layer] = []
    flags: list[str] = []
    ordered: list[onnx.NodeProto] = []
    for node in list(graph.node):
        source = original_nodes.get(node.name)
        changed = [] if source is None else [i for i, name in enumerate(source.input) if node.input[i] != name]
        if changed:
            k = len(layers)
            index_name, flag = scope.fresh(f"{node.name}_layer_index"), scope.fresh(f"{node.name}_quantized_flag")
            graph.initializer.append(numpy_helper.from_array(np.array(k, np.int64), index_name))
            ordered.append(helper.make_node("Gather", [MASK_INPUT, index_name], [flag], name=scope.fresh(flag)))
            for i in changed:
                float_input = source.input[i]
                if float_input in original_initializers and float_input not in present:
                    graph.initializer.append(original_initializers[float_input])
                    present.add(float_input)
            ordered += gate(_Site(scope, flag, node, source, changed, made))
            tensors = tuple(source.input[i] for i in changed if source.input[i] in annotation.configs)
            layers.append(Layer(node.name, node.op_type, tensors))
            flags.append(flag)
        else:
            ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
    graph.input.append(helper.make_tensor_value_info(MASK_INPUT, TensorProto.BOOL, [len(layers)]))
    return model, layers, flags


def _where_gate(site: _Site) -> list[onnx.NodeProto]:
    """``Where(flag, quantized, float)`` per input: both sides are computed on every run."""
    gates = []
    for i in site.changed:
        selected = site.scope.fresh(f"{site.node.name}_input{i}_selected")
        gates.append(
            helper.make_node(
                "Where",
                [site.flag, site.node.input[i], site.source.input[i]],
                [selected],
                name=site.scope.fresh(selected),
            )
        )
        site.node.input[i] = selected
    return [*gates, site.node]


def _if_gate(site: _Site) -> list[onnx.NodeProto]:
    """One ``If`` on the flag in the layer's place: its ``then`` branch holds copies of the export's nodes
    between the float inputs and the layer and the layer reading them, its ``else`` branch the layer
    reading its float inputs. Only the branch taken runs, and the float layer keeps its weights as
    initializers (ONNX Runtime pre-packs them)."""
    scope, node = site.scope, site.node
    copies: list[onnx.NodeProto] = []
    renamed: dict[str, str] = {}  # tensor of the export's nodes -> its name inside the branch

    def branch_name(tensor: str) -> str:
        producer = site.made.get(tensor)
        if producer is None:
            return tensor  # a float tensor or an initializer, read from the outer scope
        if tensor not in renamed:
            inputs = [branch_name(name) if name else name for name in producer.input]
            copies.append(_renamed_copy(producer, inputs, scope))
            renamed.update(zip(producer.output, copies[-1].output, strict=True))
        return renamed[tensor]

    quantized = _renamed_copy(node, [branch_name(name) if name else name for name in node.input], scope)
    floating = _renamed_copy(site.source, list(site.source.input), scope)
    outputs = [name for name in node.output if name]

    def branch(nodes: list[onnx.NodeProto], copy: onnx.NodeProto, what: str) -> onnx.GraphProto:
        results = [onnx.ValueInfoProto(name=copy.output[i]) for i, name in enumerate(node.output) if name]
        return helper.make_graph(nodes, scope.fresh(f"{node.name}_{what}"), [], results)

    gate = helper.make_node(
        "If",
        [site.flag],
        outputs,
        name=scope.fresh(f"{node.name}_gate"),
        then_branch=branch([*copies, quantized], quantized, "quantized"),
        else_branch=branch([floating], floating, "float"),
    )
    return [gate]


def _renamed_copy(node: onnx.NodeProto, inputs: list[str], scope: NameScope) -> onnx.NodeProto:
    """``node`` reading ``inputs``, its outputs and its name fresh (a branch may not reuse an outer name)."""
    outputs = [scope.fresh(f"{name}_gated") if name else name for name in node.output]
    clone = helper.make_node(node.op_type, inputs, outputs, name=scope.fresh(f"{node.name}_gated"), domain=node.domain)
    clone.attribute.extend(node.attribute)
    return clone


@dataclass(frozen=True)
class GatedModel:
    model: onnx.ModelProto
    layers: tuple[Layer, ...]
    outputs: tuple[str, ...]  # the model's own outputs, its only outputs
    flags: tuple[str, ...]  # per layer, the tensor its If reads: a Gather of the mask input


def gated_model(prepared: PreparedModel, annotation: Annotation) -> GatedModel:
    """The exported graph with each layer's Q/DQ behind an ``If`` on its mask flag (see module). The
    export's own nodes, read by nobody once every layer is gated, are dropped."""
    model, layers, flags = _switched(prepared, annotation, _if_gate)
    graph = model.graph
    original = {node.name for node in prepared.model.graph.node}
    needed = set(GraphIndex(graph).graph_outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(graph.node):  # topological order: a node's readers come after it
        if node.name in original or needed & set(node.output):
            kept.append(node)
            needed.update(node.input)
            needed.update(subgraph_references(node))
    del graph.node[:]
    graph.node.extend(reversed(kept))
    outputs = tuple(o.name for o in prepared.model.graph.output)
    return GatedModel(model, tuple(layers), outputs, tuple(flags))


def switchable_model(prepared: PreparedModel, annotation: Annotation) -> SwitchableModel:
    """The exported graph with every rewired node input behind a ``Where`` on its layer's mask flag,
    every quantized activation and its dequantized value a graph output (see module)."""
    model, layers, _ = _switched(prepared, annotation, _where_gate)
    graph = model.graph
    dequantized = _dequantized_outputs(graph, set(annotation.activations))
    outputs = tuple(o.name for o in prepared.model.graph.output)
    existing = set(outputs) | set(GraphIndex(graph).graph_inputs)
    typed = onnx.shape_inference.infer_shapes(model) if fits_in_protobuf(model) else model
    known = {v.name: v for v in [*typed.graph.value_info, *typed.graph.input, *typed.graph.output]}
    for tensor, dq_output in dequantized.items():  # typed as shape inference knew t (ONNX Runtime takes untyped)
        for name in (tensor, dq_output):
            if name not in existing:
                output = onnx.ValueInfoProto(name=name)
                if tensor in known:
                    output.type.CopyFrom(known[tensor].type)
                graph.output.append(output)
                existing.add(name)
    return SwitchableModel(model, tuple(layers), dequantized, outputs)


def _dequantized_outputs(graph: onnx.GraphProto, activations: set[str]) -> dict[str, str]:
    """activation t -> output of the DequantizeLinear after t's QuantizeLinear (a Clip may precede it)."""
    produced_from: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "Clip" and node.input and node.input[0] in activations:
            produced_from[node.output[0]] = node.input[0]
    quantized: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "QuantizeLinear":
            source = produced_from.get(node.input[0], node.input[0])
            if source in activations:
                quantized[node.output[0]] = source
    return {
        quantized[n.input[0]]: n.output[0]
        for n in graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in quantized
    }
