"""Casts at a graph's edges: the graph computes in one float type while its inputs and outputs keep
another, so the user's code feeds and reads the model as before.

Used both ways: a float16 model made to compute in float32 for quantization
(``quantcore.prepare.half_precision``), and the float32 model made to compute in float16 for the engine's FP16
baseline (``quantcore.tensorrt.fp16_model``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import onnx
from onnx import helper

from quantcore.graph.index import GraphIndex, NameScope, rename_reads


@dataclass(frozen=True)
class EdgeCast:
    node: str  # the Cast's name
    tensor: str  # the graph input or output it converts
    elem_type: int  # that input's or output's own element type
    output: bool  # True for an output's Cast


def cast_edges(graph: onnx.GraphProto, types: Collection[int], inner: int, suffix: str) -> list[EdgeCast]:
    """Rewrite ``graph`` (in place) so that each graph input of an element type in ``types`` is cast to
    ``inner`` where it enters, every reader (in subgraphs too) reading the cast, and each graph output of
    such a type is produced as a cast from ``inner`` of what its producer now writes under a new name
    (``<name><suffix>``). An output that is itself a graph input passes through as it is. Returns the
    Casts made."""
    index = GraphIndex(graph)
    scope = NameScope(index.used_names())
    first: list[onnx.NodeProto] = []
    last: list[onnx.NodeProto] = []
    renamed: dict[str, str] = {}
    edges: list[EdgeCast] = []
    for value_info in graph.input:
        elem_type = value_info.type.tensor_type.elem_type
        if elem_type in types and value_info.name not in index.initializers:
            inner_name = renamed[value_info.name] = scope.fresh(f"{value_info.name}{suffix}")
            first.append(_cast(value_info.name, inner_name, inner, scope))
            edges.append(EdgeCast(first[-1].name, value_info.name, elem_type, output=False))
    for value_info in graph.output:
        elem_type = value_info.type.tensor_type.elem_type
        if elem_type not in types or value_info.name in index.graph_inputs:
            continue
        inner_name = renamed[value_info.name] = scope.fresh(f"{value_info.name}{suffix}")
        last.append(_cast(inner_name, value_info.name, elem_type, scope))
        edges.append(EdgeCast(last[-1].name, value_info.name, elem_type, output=True))
        for node in graph.node:
            node.output[:] = [inner_name if name == value_info.name else name for name in node.output]
        for tensor in graph.initializer:  # a constant output
            if tensor.name == value_info.name:
                tensor.name = inner_name
    for node in graph.node:
        rename_reads(node, renamed)
    kept = [*first, *graph.node, *last]
    del graph.node[:]
    graph.node.extend(kept)
    return edges


def _cast(source: str, target: str, to: int, scope: NameScope) -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [target], name=scope.fresh(f"{target}/Cast"), to=to)
