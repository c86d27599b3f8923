"""Each quantized region's cost, quantized and float, estimated from two node profiles
(``quantcore.evaluate.node_profile``): the FP32 model's and the QDQ model's, at each batch size.

Attribution. A profiled node is a node of ONNX Runtime's optimized graph; it is traced back to a node of
the model that was profiled (the prepared graph, or the exported QDQ graph) by, in order:

1. its name, as is, or without the ``_token_<n>`` ONNX Runtime appends to a node a QDQ fusion rewrote
   (``conv1_token_3``: the QLinearConv that ran DequantizeLinear → conv1 → QuantizeLinear), or without
   the ``/<Name>Fusion/`` a float fusion appends (``/MatMul/MatmulTransposeFusion//MatMulScaleFusion/``);
2. its name without ``_nchwc``, a tensor of the model: an NCHWc Conv is named after its output tensor,
   which (a Relu or Add fused in) the last node it absorbed wrote;
3. an output tensor the model has: its producer.

After steps 2 and 3 the node found may be the last one a fusion absorbed: the nearest of it and its
ancestors with the profiled node's op type (the Conv under a fused Relu) stands for the fused node; with
none of that op type, the profiled node is ONNX Runtime's own (a ``ReorderOutput`` writing the tensor).

A traced node then belongs to a region (``quantcore.analysis.regions``) when it is one of the region's
nodes, or a QuantizeLinear / DequantizeLinear of one of the region's tensors (its boundary and inner
conversions), or the DequantizeLinear of a weight one of its nodes reads. Nodes ONNX Runtime added
(layout ``Transpose``, ``ReorderInput``/``ReorderOutput``) belong where their neighbours do: the owner
of the node writing their first input, else of one reading their output (in the optimized graph), since
they exist only to feed or drain those kernels. Nodes still unowned, and nodes of float parts of the
model, belong to no region.

Estimate. Per batch size b, a region's float time F_b is the sum of its nodes in the FP32 profile and its
quantized time Q_b the sum of its nodes and conversions in the QDQ profile (µs). Its cost is the change
its quantization makes to the FP32 model's time, weighted alike at every batch size:
``cost = Σ_b (Q_b - F_b) / T_b`` with T_b the FP32 profile's node total. A region with ``cost > 0``
does not pay for its conversions and goes float (``quantcore.analysis.placement``). A region to which no
node of one of the profiles was traced, at some batch size, has no estimate: the placement measures it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from quantcore.analysis.regions import Region
from quantcore.evaluate.node_profile import NodeProfile, ProfiledNode
from quantcore.graph.index import GraphIndex

_FUSED = re.compile(r"_token_\d+$|(/\w+Fusion/)+$")
_NCHWC = "_nchwc"
CONVERSIONS = frozenset({"QuantizeLinear", "DequantizeLinear"})
FUSION_DEPTH = 3  # ops ONNX Runtime fuses into a Conv or MatMul after it: Add, then Relu/Clip, ...


@dataclass(frozen=True)
class RegionCost:
    """One region's float and quantized time per batch size (µs), and its cost (see module); ``cost`` is
    None where the region has no estimate."""

    float_us: dict[int, float]
    quantized_us: dict[int, float]
    cost: float | None


class _Owners:
    """Which region (its index in ``regions``) each node and quantized tensor of one profiled model is part
    of."""

    def __init__(self, graph: onnx.GraphProto, regions: Sequence[Region]) -> None:
        self.index = GraphIndex(graph)
        self.names = {node.name: node for node in graph.node}
        self.region_of: dict[str, int] = {}
        tensors: dict[str, int] = {}
        for position, region in enumerate(regions):
            self.region_of.update(dict.fromkeys(region.nodes, position))
            tensors.update(dict.fromkeys(region.tensors, position))
        for node in graph.node:
            if node.op_type in CONVERSIONS and node.name not in self.region_of:
                owner = self._conversion_owner(node, tensors)
                if owner is not None:
                    self.region_of[node.name] = owner

    def _conversion_owner(self, node: onnx.NodeProto, tensors: Mapping[str, int]) -> int | None:
        """The region of a Q/DQ node's activation (a DequantizeLinear's through the QuantizeLinear that feeds
        it), or of the node reading a weight it dequantizes."""
        source = node.input[0]
        producer = self.index.producers.get(source)
        if node.op_type == "DequantizeLinear" and producer is not None and producer.op_type == "QuantizeLinear":
            source = producer.input[0]
        if source in tensors:
            return tensors[source]
        readers = [
            self.region_of.get(consumer.name)
            for output in node.output
            for consumer, _ in self.index.consumers.get(output, [])
        ]
        return next((r for r in readers if r is not None), None)

    def traced(self, node: ProfiledNode) -> str | None:
        """The model's node ``node`` runs (see module, steps 1-3), None when no step finds one."""
        for name in (node.name, _FUSED.sub("", node.name)):
            if name in self.names:
                return name
        for tensor in (node.name.removesuffix(_NCHWC), *node.outputs):
            producer = self.index.producers.get(tensor)
            if producer is not None:
                return self._fused_head(producer, node.op_type)
        return None

    def _fused_head(self, last: onnx.NodeProto, op_type: str) -> str | None:
        """The node a fusion ending in ``last`` started from: the nearest of ``last`` and its ancestors (up to
        ``FUSION_DEPTH`` producers up) of the fused node's op type (a Conv with a Relu fused in is named after the
        Relu's output); None when there is none (a layout node of ONNX Runtime's own writing a model's tensor)."""
        frontier = [last]
        for _ in range(FUSION_DEPTH + 1):
            head = next((n for n in frontier if n.op_type == op_type), None)
            if head is not None:
                return head.name
            frontier = [p for n in frontier for t in n.input if (p := self.index.producers.get(t)) is not None]
        return None


def attribute(profile: NodeProfile, graph: onnx.GraphProto, regions: Sequence[Region]) -> list[int | None]:
    """For each of ``profile``'s nodes, the index in ``regions`` of the region it belongs to, or None (float,
    or untraced). Precondition: ``graph`` is the graph that was profiled and ``regions`` are of its annotation."""
    owners = _Owners(graph, regions)
    traced = [owners.traced(node) for node in profile.nodes]
    found = [owners.region_of.get(name) if name is not None else None for name in traced]
    writers = {output: i for i, node in enumerate(profile.nodes) for output in node.outputs}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(profile.nodes):
        for tensor in node.inputs:
            readers.setdefault(tensor, []).append(i)
    for i in [i for i, name in enumerate(traced) if name is None]:  # ONNX Runtime's own nodes: by their neighbours
        node = profile.nodes[i]
        writer = writers.get(node.inputs[0]) if node.inputs else None
        if writer is not None and found[writer] is not None:
            found[i] = found[writer]
            continue
        next_owner = (found[j] for output in node.outputs for j in readers.get(output, ()) if found[j] is not None)
        found[i] = next(next_owner, None)
    return found


def region_costs(
    fp32: Mapping[int, NodeProfile],
    fp32_graph: onnx.GraphProto,
    quantized: Mapping[int, NodeProfile],
    quantized_graph: onnx.GraphProto,
    regions: Sequence[Region],
) -> list[RegionCost]:
    """Each region's ``RegionCost`` over the batch sizes both profiles have (see module). Preconditions: the
    profiles are of ``fp32_graph`` and ``quantized_graph``, ``regions`` of the QDQ model's annotation, whose
    node names are the FP32 graph's."""
    batches = sorted(set(fp32) & set(quantized))
    float_us = {b: _sums(fp32[b], attribute(fp32[b], fp32_graph, regions), len(regions)) for b in batches}
    quantized_us = {
        b: _sums(quantized[b], attribute(quantized[b], quantized_graph, regions), len(regions)) for b in batches
    }
    totals = {b: sum(node.us for node in fp32[b].nodes) for b in batches}
    costs = []
    for position in range(len(regions)):
        f = {b: float_us[b][position] for b in batches}
        q = {b: quantized_us[b][position] for b in batches}
        estimated = batches and all(f[b] > 0 and q[b] > 0 for b in batches)
        cost = sum((q[b] - f[b]) / totals[b] for b in batches) if estimated else None
        costs.append(RegionCost(f, q, cost))
    return costs


def _sums(profile: NodeProfile, owners: Sequence[int | None], count: int) -> list[float]:
    sums = [0.0] * count
    for node, owner in zip(profile.nodes, owners, strict=True):
        if owner is not None:
            sums[owner] += node.us
    return sums
