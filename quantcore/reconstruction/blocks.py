"""Partition the prepared ONNX graph into reconstruction blocks, by rules (as in the BRECQ seed).

A *weighted node* is a Conv/ConvTranspose/Gemm/MatMul one of whose inputs is an annotated parameter.

- **layer** (AdaRound's unit): a weighted node plus the chain of activations after it (Relu, Clip, ...;
  each the only consumer of the previous output). BatchNormalization is already folded by prepare.
- **cuts**: position i of the topologically ordered nodes is a cut when at most one activation tensor
  produced at or before i is still read after i (graph inputs count as produced before the first node).
  Between two cuts the graph has branches or multiple-consumer tensors in flight, so a residual
  connection, an Inception-style fork or an attention pattern never straddles a cut.
- **units**: the segments between cuts. Activations (``ACTIVATION_OPS``) right after a weighted unit
  close it. Any other convertible weight-free segment (pooling, flatten, reshape) opens the weighted
  unit after it, or closes the last weighted unit of the graph; an unconvertible one stands alone and
  is not reconstructed (nothing to learn in it). So a block's output is its last layer's activation,
  before any pooling, as BRECQ's ResNet blocks end before the global pooling. Attached to the block
  before it, a pooling makes that block's loss an error of pooled features, which averages the
  error over positions and leaves λ·R(V) relatively stronger by the pooled area: measured on the
  bench's resnet at W4A8, 300 steps, seed 0, logit SQNR 33.3 dB with the pooling in the last
  residual block, 35.6 dB with it in the head's block (AdaRound, which never includes it: 37.2).
- **blocks** (BRECQ / QDrop): a unit with two or more weighted nodes (a residual block) is one block;
  consecutive units with one weighted node each are grouped, up to ``MAX_GROUPED_LAYERS``, except a
  unit that produces a graph output (the classifier head): it is a block of its own, as BRECQ's code
  reconstructs a ResNet's final FC layer alone. Grouped with the layer before it, the loss is on the
  logits, whose scale dwarfs λ·R(V) (measured on the digits CNN at W4A8, 300 steps: 17 % of the
  previous conv's h(V) undecided when hardened, logit SQNR 26.6 dB against 29.2 dB alone).

A block holding a node ``torch_ops.unsupported`` refuses (an op without a converter, or attributes its
converter does not reproduce) is still listed, with the reasons in ``unsupported``; the reconstruction
loop leaves it at round-to-nearest and says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import onnx

from quantcore.annotate.annotation import Annotation
from quantcore.graph.ops import COMPUTE_OPS
from quantcore.reconstruction.torch_ops import unsupported

MAX_GROUPED_LAYERS = 3
ACTIVATION_OPS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish"})


@dataclass(frozen=True)
class Block:
    """Nodes reconstructed together. inputs: activation tensors read from outside the block (graph
    inputs included); outputs: tensors produced inside and read outside or by the graph outputs;
    weights: the annotated parameters its weighted nodes read; kind: layer | layers | residual | graph;
    unsupported: why nodes of it cannot run in torch (``torch_ops.unsupported``, distinct, sorted)."""

    name: str
    kind: str
    nodes: tuple[onnx.NodeProto, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[str, ...]
    unsupported: tuple[str, ...]

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]


def is_weighted(node: onnx.NodeProto, parameters: frozenset[str]) -> bool:
    return node.op_type in COMPUTE_OPS and any(name in parameters for name in node.input)


def _constant_outputs(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer}
    names |= {o for node in graph.node if node.op_type == "Constant" for o in node.output}
    return names


def _make_block(
    nodes: Sequence[onnx.NodeProto], kind: str, graph: onnx.GraphProto, parameters: frozenset[str]
) -> Block:
    constants = _constant_outputs(graph)
    inside = {id(node) for node in nodes}
    produced = {o for node in nodes for o in node.output if o}
    inputs = [
        name
        for node in nodes
        for name in node.input
        if name and name not in produced and name not in constants and name not in parameters
    ]
    read_outside = {name for node in graph.node if id(node) not in inside for name in node.input}
    read_outside |= {o.name for o in graph.output}
    outputs = [o for node in nodes for o in node.output if o and o in read_outside]
    weights = [name for node in nodes if is_weighted(node, parameters) for name in node.input if name in parameters]
    reasons = sorted({reason for node in nodes if (reason := unsupported(node)) is not None})
    return Block(
        name=nodes[0].name if len(nodes) == 1 else f"{nodes[0].name} .. {nodes[-1].name}",
        kind=kind,
        nodes=tuple(nodes),
        inputs=tuple(dict.fromkeys(inputs)),
        outputs=tuple(dict.fromkeys(outputs)),
        weights=tuple(dict.fromkeys(weights)),
        unsupported=tuple(reasons),
    )


def _cuts(nodes: Sequence[onnx.NodeProto], graph: onnx.GraphProto) -> list[int]:
    """Positions i (after nodes[i]) where at most one activation tensor is in flight: t is in flight
    at i when start(t) <= i < last read of t, start = producer position (first read for graph inputs)."""
    constants = _constant_outputs(graph)
    start: dict[str, int] = {}
    last_read: dict[str, int] = {}
    for position, node in enumerate(nodes):
        for name in node.input:
            if name and name not in constants:
                start.setdefault(name, position)
                last_read[name] = position
        for name in node.output:
            start.setdefault(name, position)
    return [
        position
        for position in range(len(nodes) - 1)
        if sum(1 for name, end in last_read.items() if start[name] <= position < end) <= 1
    ]


def _units(nodes: list[onnx.NodeProto], graph: onnx.GraphProto, parameters: frozenset[str]) -> list[list]:
    """Segments between cuts, weight-free ones attached as the module docstring says."""
    bounds = [-1, *_cuts(nodes, graph), len(nodes) - 1]
    units: list[list] = []
    pending: list = []  # convertible weight-free segments waiting for the next weighted one

    def last_is_weighted() -> bool:
        return bool(units) and any(is_weighted(n, parameters) for n in units[-1])

    def settle() -> None:  # pending segments with no weighted unit after them
        if pending and last_is_weighted():
            units[-1].extend(pending)
        elif pending:
            units.append(list(pending))
        pending.clear()

    for a, b in itertools.pairwise(bounds):
        segment = nodes[a + 1 : b + 1]
        if any(is_weighted(n, parameters) for n in segment):
            units.append([*pending, *segment])
            pending.clear()
        elif not pending and last_is_weighted() and all(n.op_type in ACTIVATION_OPS for n in segment):
            units[-1].extend(segment)
        elif all(unsupported(n) is None for n in segment):
            pending.extend(segment)
        else:
            settle()
            units.append(list(segment))
    settle()
    return units


def layers(graph: onnx.GraphProto, annotation: Annotation) -> list[Block]:
    """AdaRound's units: each weighted node with the activation chain after it."""
    parameters = annotation.parameters
    nodes = [n for n in graph.node if n.op_type != "Constant"]
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    blocks = []
    for node in nodes:
        if not is_weighted(node, parameters):
            continue
        chain = [node]
        while True:
            out = chain[-1].output[0]
            readers = consumers.get(out, [])
            if out in graph_outputs or len(readers) != 1 or readers[0].op_type not in ACTIVATION_OPS:
                break
            chain.append(readers[0])
        blocks.append(_make_block(chain, "layer", graph, parameters))
    return blocks


def whole_graph(graph: onnx.GraphProto, annotation: Annotation) -> Block:
    """Every node of ``graph`` as one block (kind ``graph``, what ``quantcore.qat`` trains): inputs are
    the graph inputs read, outputs the graph outputs, and weights every annotated parameter a node
    reads, weighted or not (a parameter added to an activation is stored quantized as well)."""
    nodes = [n for n in graph.node if n.op_type != "Constant"]
    block = _make_block(nodes, "graph", graph, annotation.parameters)
    read = [name for node in nodes for name in node.input if name in annotation.parameters]
    return replace(block, weights=tuple(dict.fromkeys(read)))


def partition(graph: onnx.GraphProto, annotation: Annotation, *, blockwise: bool) -> list[Block]:
    """The blocks of ``graph`` in execution order: layers (``blockwise=False``) or BRECQ blocks."""
    if not blockwise:
        return layers(graph, annotation)
    parameters = annotation.parameters
    nodes = [n for n in graph.node if n.op_type != "Constant"]
    outputs = {o.name for o in graph.output}
    blocks: list[Block] = []
    group: list[list] = []

    def flush() -> None:
        if group:
            kind = "layer" if len(group) == 1 else "layers"
            blocks.append(_make_block([n for unit in group for n in unit], kind, graph, parameters))
            group.clear()

    for unit in _units(nodes, graph, parameters):
        weighted = sum(1 for n in unit if is_weighted(n, parameters))
        if weighted == 0:
            flush()
        elif weighted == 1 and any(o in outputs for n in unit for o in n.output):
            flush()  # the output layer (the classifier) stays alone, as in BRECQ's ResNet partition
            group.append(unit)
            flush()
        elif weighted == 1:
            group.append(unit)
            if len(group) == MAX_GROUPED_LAYERS:
                flush()
        else:
            flush()
            blocks.append(_make_block(unit, "residual", graph, parameters))
    flush()
    return blocks
