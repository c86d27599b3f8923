"""Nodes that prepare decides must stay float whatever the platform: ``PreparedModel.float_nodes``
maps each one's name to the reason (annotation keeps them float and the report lists them).

- **LayerNorm written out in elementary ops** (what exporters without a LayerNormalization op emit)::

      μ = ReduceMean(x)            d = x - μ                  v = ReduceMean(d²)      (d² as Pow(d, 2) or d·d)
      y = d / Sqrt(v + ε)          (or d · Reciprocal(Sqrt(v + ε)))     then optionally y·gamma + beta

  The variance of an int8-quantized d loses the small deviations that dominate it, so the whole
  region runs in float; its input x and its output may still be quantized by their other readers.
- **A magnitude** ``Sqrt(a² + b²)`` (squares as Pow(·, 2) or a·a; the STFT front end of audio
  models): a² spans twice the dynamic range of a in bits, so int8 on the sum keeps only the loudest
  bins and zeroes the rest.
- **Recurrent ops** (LSTM, GRU, RNN): their gates compound rounding error over time steps.
- **Control flow left in the graph** (If, Loop, Scan): annotation does not enter subgraphs.
"""

from __future__ import annotations

import onnx

from quantcore.graph import GraphIndex

RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
LAYERNORM_REASON = "decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div): variance does not survive int8"
MAGNITUDE_REASON = "magnitude Sqrt(a^2 + b^2): the squares' dynamic range does not survive int8"


def _only_consumer(index: GraphIndex, name: str, op_types: set[str]) -> onnx.NodeProto | None:
    users = index.consumers.get(name, [])
    if len(users) == 1 and users[0][0].op_type in op_types:
        return users[0][0]
    return None


def _scalar_constant(index: GraphIndex, name: str) -> float | None:
    if not index.is_initializer(name):
        return None
    value = index.array(name)
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _is_constant(index: GraphIndex, name: str) -> bool:
    return index.is_constant(name)


def _square(index: GraphIndex, name: str) -> onnx.NodeProto | None:
    """The node producing ``name`` as a square, Pow(a, 2) or Mul(a, a); None otherwise."""
    node = index.producers.get(name)
    if node is None:
        return None
    if node.op_type == "Pow" and len(node.input) == 2 and _scalar_constant(index, node.input[1]) == 2.0:
        return node
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return node
    return None


def _magnitude_at(index: GraphIndex, add: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """[square, square, add, sqrt] when ``add`` sums two squares and only a Sqrt reads it."""
    if len(add.input) != 2:
        return None
    squares = [_square(index, name) for name in add.input]
    sqrt = _only_consumer(index, add.output[0], {"Sqrt"})
    if sqrt is None or any(s is None for s in squares):
        return None
    return [*squares, add, sqrt]


def _layernorm_at(index: GraphIndex, mean_node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes of a decomposed LayerNorm starting at ``mean_node`` (μ = ReduceMean(x)), or None."""
    x, mean = mean_node.input[0], mean_node.output[0]
    sub = next((n for n, _ in index.consumers.get(mean, []) if n.op_type == "Sub" and list(n.input) == [x, mean]), None)
    if sub is None:
        return None
    d = sub.output[0]
    for square, _ in index.consumers.get(d, []):
        is_square = (square.op_type == "Pow" and _scalar_constant(index, square.input[1]) == 2.0) or (
            square.op_type == "Mul" and list(square.input) == [d, d]
        )
        if not is_square:
            continue
        variance = _only_consumer(index, square.output[0], {"ReduceMean"})
        add_eps = variance and _only_consumer(index, variance.output[0], {"Add"})
        sqrt = add_eps and _only_consumer(index, add_eps.output[0], {"Sqrt"})
        if sqrt is None:
            continue
        region = [mean_node, sub, square, variance, add_eps, sqrt]
        norm = _only_consumer(index, sqrt.output[0], {"Div", "Reciprocal"})
        if norm is not None and norm.op_type == "Reciprocal":
            region.append(norm)
            norm = _only_consumer(index, norm.output[0], {"Mul"})
        if norm is None or d not in norm.input:
            continue
        region.append(norm)
        scale = _only_consumer(index, norm.output[0], {"Mul"})
        if scale is not None and any(_is_constant(index, n) for n in scale.input):
            region.append(scale)
            shift = _only_consumer(index, scale.output[0], {"Add"})
            if shift is not None and any(_is_constant(index, n) for n in shift.input):
                region.append(shift)
        return region
    return None


def float_regions(graph: onnx.GraphProto) -> dict[str, str]:
    """Node name → reason, for every main-graph node that must stay float (module docstring)."""
    index = GraphIndex(graph)
    reasons: dict[str, str] = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "ReduceMean":
            for member in _layernorm_at(index, node) or []:
                reasons.setdefault(member.name, LAYERNORM_REASON)
        elif node.op_type == "Add":
            for member in _magnitude_at(index, node) or []:
                reasons.setdefault(member.name, MAGNITUDE_REASON)
        elif node.op_type in RECURRENT_OPS:
            reasons[node.name] = f"recurrent op {node.op_type}: left float"
        elif node.op_type in CONTROL_FLOW_OPS:
            reasons[node.name] = f"{node.op_type} not foldable before run time: its subgraphs stay float"
    return reasons
