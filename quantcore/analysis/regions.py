"""Quantized regions: the parts of an annotated graph that run as integer kernels between float boundaries.

Two quantized nodes (annotation decision ``quantized``) belong to the same region when a quantized
activation tensor joins them: one writes it and the other reads its dequantized value, or both read
it (one QuantizeLinear feeds them both, so neither can drop it alone), or the second is the only reader
of the first's unquantized output (a Relu or Clip that took its producer's output quantization over:
the integer kernel runs both). A region is a maximal group so
joined, i.e. a connected component of that relation; its edges to float nodes, graph inputs and
outputs are where its Q/DQ conversions sit. Weights and biases join nothing: each belongs to the one
node that reads it.

Keeping a region in float means excluding its nodes (``QuantizeConfig.exclude_node_patterns``) and
annotating again: the region's Q/DQ pairs go, and its neighbours' rules decide afresh
(``quantcore.analysis.placement``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from quantcore.annotate.annotation import QUANTIZED, Annotation
from quantcore.graph.index import GraphIndex


@dataclass(frozen=True)
class Region:
    """One region: its quantized nodes in graph order, and the activation tensors quantized inside or
    on its boundary (sorted)."""

    nodes: tuple[str, ...]
    tensors: tuple[str, ...]

    def op_types(self, graph: onnx.GraphProto) -> dict[str, int]:
        """op type → how many of the region's nodes have it."""
        return count_op_types(graph, self.nodes)


def count_op_types(graph: onnx.GraphProto, nodes: tuple[str, ...]) -> dict[str, int]:
    """op type → how many of ``nodes`` have it."""
    members = set(nodes)
    return dict(Counter(node.op_type for node in graph.node if node.name in members))


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        root = self.parent.setdefault(name, name)
        while root != self.parent[root]:
            root = self.parent[root]
        while self.parent[name] != root:  # path compression
            self.parent[name], name = root, self.parent[name]
        return root

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def quantized_regions(graph: onnx.GraphProto, annotation: Annotation) -> tuple[Region, ...]:
    """The regions of ``graph`` under ``annotation`` (as the module defines them), ordered by their first
    node in graph order. Precondition: ``annotation`` was made for ``graph`` (node and tensor names
    match); it may be calibrated or not."""
    quantized = {name for name, decision in annotation.decisions.items() if decision == QUANTIZED}
    index = GraphIndex(graph)
    joined = _UnionFind()
    for name in quantized:
        joined.find(name)
    touching: dict[str, list[str]] = {}  # activation tensor → the quantized nodes it joins
    for tensor in annotation.activations:
        members = [use.node for use in annotation.consumers.get(tensor, ()) if use.node in quantized]
        producer = index.producers.get(tensor)
        if producer is not None and producer.name in quantized:
            members.append(producer.name)
        for member in members[1:]:
            joined.union(members[0], member)
        if members:
            touching[tensor] = members
    for node in graph.node:  # an activation that takes its producer's output quantization over (Conv → Relu → Q)
        if node.name not in quantized:
            continue
        for output in node.output:
            readers = index.consumers.get(output, [])
            if output not in annotation.configs and len(readers) == 1 and readers[0][0].name in quantized:
                joined.union(node.name, readers[0][0].name)
    order = {node.name: position for position, node in enumerate(graph.node)}
    groups: dict[str, list[str]] = {}
    for name in quantized:
        groups.setdefault(joined.find(name), []).append(name)
    tensors: dict[str, set[str]] = {}
    for tensor, members in touching.items():
        tensors.setdefault(joined.find(members[0]), set()).add(tensor)
    regions = [
        Region(tuple(sorted(nodes, key=lambda n: order.get(n, len(order)))), tuple(sorted(tensors.get(root, ()))))
        for root, nodes in groups.items()
    ]
    return tuple(sorted(regions, key=lambda region: order.get(region.nodes[0], len(order))))
