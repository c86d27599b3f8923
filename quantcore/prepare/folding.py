"""Graph simplifications done before quantization: constant folding and BatchNormalization folding.

BatchNormalization after Conv/ConvTranspose/Gemm, with sigma = sqrt(var + ε) and k = gamma / sigma
(per output channel c)::

    BN(y) = gamma · (y - μ) / sigma + β
    W'[c] = k[c] · W[c]                   # along the output-channel axis of W
    b'[c] = k[c] · (b[c] - μ[c]) + β[c]   # b = 0 when the node has no bias

For Gemm, Y = alpha·A·B + β_g·C, so C' = k·(β_g·C - μ) + β and β_g becomes 1. Arithmetic is float64,
stored back in the weight's dtype. A BN folds only when its producer's output feeds nothing else (and
is no graph output), every parameter is an initializer, and it runs in inference mode. The folded
node takes over the BN's output name, so downstream tensor names are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantcore.graph.index import GraphIndex, NameScope, default_opset

# Ops cheap and safe to evaluate when every input is constant: deterministic, no subgraphs, and an
# output no bigger than their inputs (broadcasting ops are checked before evaluation). Ops whose
# output size is set by an input's *values* (ConstantOfShape, Expand, Tile, Range) are left alone.
FOLDABLE_OPS = frozenset(
    {
        "Constant",
        "Identity",
        "Cast",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Concat",
        "Gather",
        "Slice",
        "Shape",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Sqrt",
        "Reciprocal",
        "Pow",
        # comparisons and logic: the conditions of If nodes (quantcore.prepare.branches)
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Xor",
        "Size",
    }
)
SHAPE_OPS = frozenset({"Shape", "Size"})  # foldable from a statically known input shape alone
BROADCASTING_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"}
)
MAX_FOLD_ELEMENTS = 1 << 24  # don't materialise constants bigger than this (64 MB of float32)


@dataclass(frozen=True)
class FoldedBatchNorm:
    node: str  # the Conv/ConvTranspose/Gemm that absorbed it
    batchnorm: str  # the removed BatchNormalization node
    output: str  # tensor name now produced by ``node``


def static_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape, for every tensor whose declared or inferred shape is fully fixed."""
    shapes = {}
    for value_info in [*graph.input, *graph.value_info]:
        if not value_info.type.HasField("tensor_type") or not value_info.type.tensor_type.HasField("shape"):
            continue
        dims = value_info.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            shapes[value_info.name] = tuple(int(d.dim_value) for d in dims)
    return shapes


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    """Output of Shape (with its opset-15 start/end) or Size for an input of static ``shape``."""
    if node.op_type == "Size":
        return np.asarray(int(np.prod(shape)), dtype=np.int64)
    start, end = _attribute(node, "start", 0), _attribute(node, "end", None)
    return np.asarray(shape[slice(start, end)], dtype=np.int64)


def fold_constants(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None) -> int:
    """Replace main-graph nodes of ``FOLDABLE_OPS`` whose inputs are all constant by initializers.

    ``shapes`` (from ``static_shapes``): Shape/Size of a tensor with a fixed shape fold too, even
    when the tensor itself is not constant.

    Nodes producing a graph output are kept (an initializer cannot be a graph output in every
    runtime). Initializers left unused by the folding are removed. Returns the number of folded nodes.
    Mutates ``model``.
    """
    graph = model.graph
    opset = default_opset(model) or 13
    graph_outputs = {o.name for o in graph.output}
    graph_input_names = {i.name for i in graph.input}
    known: dict[str, np.ndarray] = {}
    initializers = {t.name: t for t in graph.initializer}

    def constant(name: str) -> np.ndarray | None:
        if name in known:
            return known[name]
        if name in initializers and name not in graph_input_names:  # a graph input can override it
            known[name] = numpy_helper.to_array(initializers[name])
            return known[name]
        return None

    folded: list[onnx.NodeProto] = []
    new_constants: dict[str, np.ndarray] = {}
    for node in graph.node:
        if node.op_type not in FOLDABLE_OPS or node.domain not in ("", "ai.onnx"):
            continue
        if any(o in graph_outputs for o in node.output) or any(
            a.type == onnx.AttributeProto.GRAPH for a in node.attribute
        ):
            continue
        if node.op_type in SHAPE_OPS and shapes and constant(node.input[0]) is None:
            if node.input[0] not in shapes:
                continue
            value = _shape_value(node, shapes[node.input[0]])
            known[node.output[0]] = new_constants[node.output[0]] = value
            folded.append(node)
            continue
        if not all(n in known or (n in initializers and n not in graph_input_names) for n in node.input if n):
            continue  # a node with a computed input: no constant of it is read (weights may stay on disk)
        inputs = {name: constant(name) for name in node.input if name}
        if sum(v.size for v in inputs.values()) > MAX_FOLD_ELEMENTS:
            continue
        if node.op_type in BROADCASTING_OPS:
            try:
                shape = np.broadcast_shapes(*(v.shape for v in inputs.values()))
            except ValueError:
                continue
            if int(np.prod(shape)) > MAX_FOLD_ELEMENTS:
                continue
        try:
            outputs = ReferenceEvaluator(node, opsets={"": opset}).run(None, inputs)
        except Exception:  # an op the reference runtime can't evaluate simply stays
            continue
        outputs = [np.asarray(o) for o in outputs]
        if sum(o.size for o in outputs) > MAX_FOLD_ELEMENTS:
            continue
        for name, value in zip(node.output, outputs, strict=False):
            if name:
                known[name] = value
                new_constants[name] = value
        folded.append(node)

    if not folded:
        return 0
    folded_ids = {id(n) for n in folded}
    kept = [n for n in graph.node if id(n) not in folded_ids]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in new_constants.items())
    _drop_stale_value_info(graph, set(new_constants))
    remove_unused_initializers(graph)
    return len(folded)


def remove_dead_nodes(graph: onnx.GraphProto) -> int:
    """Remove main-graph nodes none of whose outputs is read (by a node, a subgraph or as a graph
    output), repeatedly, e.g. the condition of an inlined If; returns how many were removed."""
    removed = 0
    while True:
        index = GraphIndex(graph)
        dead = [
            n
            for n in graph.node
            if not any(o and (o in index.graph_outputs or index.consumers.get(o)) for o in n.output)
        ]
        if not dead:
            return removed
        dead_names = {n.name for n in dead}
        kept = [n for n in graph.node if n.name not in dead_names]
        del graph.node[:]
        graph.node.extend(kept)
        removed += len(dead)


def remove_unused_initializers(graph: onnx.GraphProto) -> None:
    """Drop initializers nothing reads (graph inputs and outputs count as readers)."""
    index = GraphIndex(graph)
    keep_names = {i.name for i in graph.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name not in keep_names and not index.consumers.get(t.name)]
    for tensor in unused:
        graph.initializer.remove(tensor)


def _drop_stale_value_info(graph: onnx.GraphProto, names: set[str]) -> None:
    stale = [v for v in graph.value_info if v.name in names]
    for value_info in stale:
        graph.value_info.remove(value_info)


def _attribute(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _set_float_attribute(node: onnx.NodeProto, name: str, value: float) -> None:
    for attribute in node.attribute:
        if attribute.name == name:
            node.attribute.remove(attribute)
            break
    node.attribute.append(helper.make_attribute(name, value))


def _output_channel_axis(node: onnx.NodeProto) -> int | None:
    """Axis of the weight holding output channels, or None when this node can't absorb a BN."""
    if node.op_type == "Conv":
        return 0  # W: (C_out, C_in/group, k...)
    if node.op_type == "ConvTranspose":
        return 1 if _attribute(node, "group", 1) == 1 else None  # W: (C_in, C_out/group, k...)
    if node.op_type == "Gemm":
        if _attribute(node, "transA", 0):
            return None
        return 0 if _attribute(node, "transB", 0) else 1  # B: (N, K) if transB else (K, N)
    return None


def fold_batchnorms(model: onnx.ModelProto) -> list[FoldedBatchNorm]:
    """Fold every eligible BatchNormalization into its producer (formulas in the module docstring).
    Mutates ``model``; returns what was folded."""
    graph = model.graph
    folded: list[FoldedBatchNorm] = []
    while True:
        index = GraphIndex(graph)
        scope = NameScope(index.used_names())
        for bn in graph.node:
            if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
                continue
            absorbed_by = _fold_one(bn, index, scope)
            if absorbed_by is not None:
                folded.append(FoldedBatchNorm(node=absorbed_by, batchnorm=bn.name, output=bn.output[0]))
                break
        else:
            break
    if folded:
        remove_unused_initializers(graph)
    return folded


def _fold_one(bn: onnx.NodeProto, index: GraphIndex, scope: NameScope) -> str | None:
    """Fold ``bn`` into its producer if eligible: rewrites the graph in place and returns the
    producer's name; None (graph untouched) when not eligible."""
    graph = index.graph
    if _attribute(bn, "training_mode", 0) or any(o for o in bn.output[1:]) or len(bn.input) != 5:
        return None
    x = bn.input[0]
    producer = index.producers.get(x)
    if producer is None or x in index.graph_outputs or len(index.consumers.get(x, [])) != 1:
        return None
    axis = _output_channel_axis(producer)
    if axis is None or producer.output[0] != x:
        return None
    if not all(index.is_initializer(name) for name in bn.input[1:]):
        return None
    weight_name = producer.input[1] if len(producer.input) > 1 else ""
    bias_name = producer.input[2] if len(producer.input) > 2 else ""
    if not index.is_initializer(weight_name) or (bias_name and not index.is_initializer(bias_name)):
        return None

    gamma, beta, mean, var = (index.array(n).astype(np.float64) for n in bn.input[1:])
    epsilon = float(_attribute(bn, "epsilon", 1e-5))
    weight = index.array(weight_name)
    channels = weight.shape[axis]
    if any(p.shape != (channels,) for p in (gamma, beta, mean, var)):
        return None
    k = gamma / np.sqrt(var + epsilon)  # (C_out,)
    shape = [1] * weight.ndim
    shape[axis] = channels
    new_weight = (weight.astype(np.float64) * k.reshape(shape)).astype(weight.dtype)

    if producer.op_type == "Gemm":
        c = index.array(bias_name).astype(np.float64) if bias_name else np.zeros(channels)
        beta_gemm = float(_attribute(producer, "beta", 1.0)) if bias_name else 0.0
        new_bias = (k * (beta_gemm * c - mean) + beta).astype(weight.dtype)
        _set_float_attribute(producer, "beta", 1.0)
    else:
        b = index.array(bias_name).astype(np.float64) if bias_name else np.zeros(channels)
        new_bias = (k * (b - mean) + beta).astype(weight.dtype)

    def store(name: str, value: np.ndarray, base: str) -> str:
        shared = name and len(index.consumers.get(name, [])) > 1
        if name and not shared and name not in {i.name for i in graph.input}:
            tensor = index.initializers[name]
            tensor.CopyFrom(numpy_helper.from_array(value, name))
            return name
        new_name = scope.fresh(base)
        graph.initializer.append(numpy_helper.from_array(value, new_name))
        return new_name

    producer.input[1] = store(weight_name, new_weight, f"{weight_name}_bn_folded")
    bias_input = store(bias_name, new_bias, f"{bias_name or producer.name}_bn_folded_bias")
    if len(producer.input) > 2:
        producer.input[2] = bias_input
    else:
        producer.input.append(bias_input)
    producer.output[0] = bn.output[0]
    graph.node.remove(bn)
    _drop_stale_value_info(graph, {x})
    return producer.name
