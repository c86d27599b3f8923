"""Read-only index of an ONNX graph: who produces and who consumes each tensor, which tensors are
initializers, and fresh names that collide with nothing.

The index is a snapshot; rebuild it after editing the graph. Tensors used implicitly inside
subgraphs (If/Loop/Scan bodies) count as consumed by the node owning the subgraph, with input
index -1, so that rewrites never break a subgraph's outer-scope reference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

SUBGRAPH_INPUT = -1  # input index recorded for an implicit use inside a subgraph


def node_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs ``node``'s attributes hold (an If's branches, a Loop's or Scan's body), in place."""
    graphs = []
    for attribute in node.attribute:
        graphs += [*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])]
    return graphs


def rename_reads(node: onnx.NodeProto, renamed: Mapping[str, str]) -> None:
    """Apply ``renamed`` to every tensor ``node`` reads: its inputs, and inside its subgraphs the inputs
    of their nodes and the outputs that name an outer tensor (a subgraph's own names never collide with
    an outer one's, so only outer tensors match)."""
    node.input[:] = [renamed.get(name, name) for name in node.input]
    for subgraph in node_subgraphs(node):
        for inner in subgraph.node:
            rename_reads(inner, renamed)
        for output in subgraph.output:
            output.name = renamed.get(output.name, output.name)


def subgraph_references(node: onnx.NodeProto) -> set[str]:
    """Names of every tensor read anywhere inside ``node``'s subgraphs (an over-approximation)."""
    names: set[str] = set()
    for subgraph in node_subgraphs(node):
        for inner in subgraph.node:
            names.update(i for i in inner.input if i)
            names |= subgraph_references(inner)
        names.update(o.name for o in subgraph.output)
    return names


class GraphIndex:
    """Producer/consumer maps of one (main) graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.graph_inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.graph_outputs = {o.name for o in graph.output}
        # tensor name -> ONNX elem_type, where known (initializers, graph inputs/outputs, value_info)
        self.elem_types: dict[str, int] = {}
        for value_info in [*graph.value_info, *graph.input, *graph.output]:
            if value_info.type.HasField("tensor_type") and value_info.type.tensor_type.elem_type:
                self.elem_types[value_info.name] = value_info.type.tensor_type.elem_type
        self.elem_types.update({t.name: t.data_type for t in graph.initializer})
        self.producers: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        for node in graph.node:
            for name in node.output:
                if name:
                    self.producers[name] = node
            for index, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, index))
            for name in subgraph_references(node):
                self.consumers[name].append((node, SUBGRAPH_INPUT))

    def is_initializer(self, name: str) -> bool:
        return name in self.initializers

    def is_constant(self, name: str) -> bool:
        """True for initializers and outputs of Constant nodes."""
        producer = self.producers.get(name)
        return name in self.initializers or (producer is not None and producer.op_type == "Constant")

    def is_float32(self, name: str, *, unknown: bool) -> bool:
        """True if ``name`` is known to be float32; ``unknown`` is the answer when its type isn't known."""
        elem_type = self.elem_types.get(name)
        return unknown if elem_type is None else elem_type == onnx.TensorProto.FLOAT

    def array(self, name: str) -> np.ndarray:
        """The value of an initializer (external data must already be loaded)."""
        return numpy_helper.to_array(self.initializers[name])

    def used_names(self) -> set[str]:
        """Every tensor and node name in the graph, for collision-free naming."""
        names = set(self.initializers) | {i.name for i in self.graph.input} | self.graph_outputs
        for node in self.graph.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
        names.discard("")
        return names


class NameScope:
    """Hands out names not yet in ``used``: ``fresh("x_scale")`` → ``x_scale``, ``x_scale_1``, ..."""

    def __init__(self, used: set[str]) -> None:
        self.used = set(used)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def ensure_node_names(graph: onnx.GraphProto) -> int:
    """Give every unnamed main-graph node a unique name ``<op_type>_<index>`` and make duplicate names
    unique; returns how many nodes were renamed. Node names are what exclusion patterns and the report
    speak; tensor names are never changed."""
    scope = NameScope({o for n in graph.node for o in n.output} | {n.name for n in graph.node if n.name})
    seen: set[str] = set()
    renamed = 0
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = scope.fresh(f"{node.op_type}_{i}")
            renamed += 1
        elif node.name in seen:
            node.name = scope.fresh(node.name)
            renamed += 1
        seen.add(node.name)
    return renamed


def value_type(value_info: onnx.ValueInfoProto) -> tuple[str, list[int | str | None] | None]:
    """(dtype, shape) of a graph input/output as plain JSON values.

    dtype: numpy dtype name ("float32") for tensors, the ONNX type kind ("sequence", "map", ...)
    otherwise. shape: one entry per dimension, an int (fixed), a str (symbolic) or None (unknown);
    None when even the rank is unknown.
    """
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        return (kind.removesuffix("_type") if kind else "unknown"), None
    tensor_type = value_info.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
    except (KeyError, TypeError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(tensor_type.elem_type).lower()
    if not tensor_type.HasField("shape"):
        return dtype, None
    shape: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            shape.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param:
            shape.append(dim.dim_param)
        else:
            shape.append(None)
    return dtype, shape


def default_opset(model: onnx.ModelProto) -> int | None:
    """Version of the default ("" / "ai.onnx") operator set, None if the model doesn't import it."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return None


def iter_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto stored in ``graph`` and its subgraphs: initializers, sparse initializers'
    values and indices, and tensor-valued node attributes (Constant values included)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield attribute.sparse_tensor.values
                yield attribute.sparse_tensor.indices
            if attribute.HasField("g"):
                yield from iter_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from iter_tensors(subgraph)


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The distinct ``location`` values of externally stored tensors, in first-seen order
    ("" for an external tensor that has no location entry)."""
    locations: dict[str, None] = {}
    for tensor in iter_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            locations.setdefault(entries.get("location", ""), None)
    return list(locations)
