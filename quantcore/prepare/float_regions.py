"""Nodes that prepare decides must stay float whatever the platform: ``PreparedModel.float_nodes``
maps each one's name to the reason (annotation keeps them float and the report lists them).

- **A normalization written out in elementary ops** (LayerNorm, RMSNorm, an L2 norm, as exporters
  without the op emit them). Found at its root, a Sqrt (or Pow by ±0.5) of a *statistic of squares*:
  squares (Pow(a, 2) or a·a) reduced by ReduceMean/ReduceSum and combined by elementwise ops and
  reshapes. PyTorch writes LayerNorm as::

      μ = ReduceMean(x)      d = x - μ      y = d / Sqrt(ReduceMean(d²) + ε)      (or d · Reciprocal(Sqrt(...)))

  JAX (through tf2onnx) as E[x²] - E[x]²::

      μ = ReduceSum(x)·(1/n)   v = Max(0, ReduceSum(x·x)·(1/n) - μ·μ)   y = (x - μ) · (Reciprocal(Sqrt(v + ε)) · g)

  (g: the scale), and RMSNorm as y = x · Reciprocal(Sqrt(ReduceMean(x²) + ε)). The normalized tensor
  x is the squared tensor the others are computed from, behind a centring x - mean(x); the region is
  every node on the paths from x to the Mul (or Div) applying the root's result to x, then a scale and
  a shift by constants. The statistics of an int8-quantized x lose the small deviations that dominate
  them (JAX's form subtracts two rounded terms of nearly equal size), so the region runs in float; x
  and the output may still be quantized by their other readers. Where no such Mul is found, the
  statistic alone.
- **A magnitude** ``Sqrt(a² + b²)`` (squares as Pow(·, 2) or a·a; the STFT front end of audio
  models): a² spans twice the dynamic range of a in bits, so int8 on the sum keeps only the loudest
  bins and zeroes the rest.
- **A power written as products** (GELU's Tanh form x · 0.5 · (1 + Tanh(√(2/π) · (x + 0.044715 · x·x·x)))):
  a product of two terms c·x^k of one x is a power of x, and x^k spans k times x's range in bits, so an
  int8 grid fitted to its largest values rounds the rest to zero (the cube in GELU: the activation
  becomes 0.5x(1 + Tanh(0.8x))). The product stays float with what is computed from it and x alone by
  elementwise ops, up to the first bounded op (Tanh, Sigmoid, Erf), whose result int8 can hold.
- **A logarithm's argument** (a spectrogram's log, as audio front ends compute it in the graph): a
  logarithm spreads out the small values that one linear int8 scale rounds to its first steps or to zero,
  so log(x) of a quantized x is off by orders of magnitude in the quiet bins. Every node on the paths
  from the nearest other op (an activation, a Softmax) or graph input to the Log stays float, and the
  Log itself: elementwise ops, reductions and data movement (``ARGUMENT_OPS``), and layers with a
  constant weight (the filterbanks of an STFT, a mel or a constant-Q transform), whose input's rounding
  would reach the quiet bins all the same. Such a front end then runs in float as a whole.
- **Recurrent ops** (LSTM, GRU, RNN): their gates compound rounding error over time steps.
- **Control flow left in the graph** (If, Loop, Scan): annotation does not enter subgraphs.
"""

from __future__ import annotations

import onnx

from quantcore.graph.index import GraphIndex
from quantcore.graph.ops import COMPUTE_OPS

RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
NORMALIZATION_REASON = (
    "normalization written out (a Sqrt of a mean of squares: LayerNorm, RMSNorm): its statistics do not survive int8"
)
# ops that combine statistics; of the others only input 0 carries data (the rest: shapes, axes, bounds)
ELEMENTWISE_STATISTIC_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})
RESHAPE_OPS = frozenset({"Reshape", "Expand", "Squeeze", "Unsqueeze", "Identity"})
STATISTIC_OPS = ELEMENTWISE_STATISTIC_OPS | RESHAPE_OPS | {"ReduceMean", "ReduceSum", "Clip", "Cast"}
POWER_REASON = (
    "power of a tensor written as products (GELU's Tanh form: x · 0.044715x · x): its range does not survive int8"
)
POWER_OPS = frozenset({"Mul", "Div", "Add", "Sub", "Neg", "Tanh", "Sigmoid", "Erf"})
BOUNDED_OPS = frozenset({"Tanh", "Sigmoid", "Erf"})  # a power's region ends at these: their results are bounded
MAX_POWER_NODES = 16
MAX_REGION_NODES = 32  # a normalization's statistic takes 4 (PyTorch's export) to 9 (JAX's via tf2onnx) nodes
LOG_REASON = "argument of a Log: one linear int8 scale erases the small values a logarithm spreads out"
# ops a Log's argument is traced back through: elementwise arithmetic, reductions, data movement
ARGUMENT_OPS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Abs", "Neg", "Max", "Min", "Clip", "Reciprocal",
        "ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "Reshape", "Transpose", "Slice", "Concat",
        "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Cast",
    }
)  # fmt: skip
# of those, the ops whose every input carries data (the others' later inputs are shapes, axes or bounds)
ARGUMENT_DATA_OPS = ELEMENTWISE_STATISTIC_OPS | {"Pow", "Concat"}
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


def _is_root(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """Sqrt, or Pow by a constant ±0.5 (a square root or its reciprocal)."""
    if node.op_type == "Sqrt":
        return True
    return node.op_type == "Pow" and len(node.input) == 2 and _scalar_constant(index, node.input[1]) in (0.5, -0.5)


def _variables(index: GraphIndex, node: onnx.NodeProto) -> list[str]:
    """The inputs of a ``STATISTIC_OPS`` node that carry data (not constants, shapes, axes or bounds)."""
    inputs = node.input if node.op_type in ELEMENTWISE_STATISTIC_OPS else node.input[:1]
    return [name for name in inputs if name and not index.is_constant(name)]


def _statistic(index: GraphIndex, name: str) -> tuple[list[onnx.NodeProto], list[str]] | None:
    """(The nodes computing ``name``, the tensors they square) when ``name`` is a statistic of squares:
    squares (Pow(a, 2) or a·a) reduced (ReduceMean/ReduceSum) and combined by ``STATISTIC_OPS``, every
    path back from ``name`` ending at a square, within ``MAX_REGION_NODES`` nodes. None otherwise."""
    nodes: dict[str, onnx.NodeProto] = {}
    squared: list[str] = []
    frontier = [name]
    while frontier:
        producer = index.producers.get(frontier.pop())
        if producer is None or len(nodes) >= MAX_REGION_NODES:
            return None
        if producer.name in nodes:
            continue
        nodes[producer.name] = producer
        square = _square(index, producer.output[0])
        if square is not None:
            squared.append(square.input[0])
        elif producer.op_type in STATISTIC_OPS:
            frontier += _variables(index, producer)
        else:
            return None
    if not squared or not any(n.op_type in ("ReduceMean", "ReduceSum") for n in nodes.values()):
        return None
    return list(nodes.values()), squared


def _computed_from(index: GraphIndex, name: str, source: str) -> bool:
    """Whether ``name`` is ``source`` or computed from it, within ``MAX_REGION_NODES`` nodes back."""
    seen: set[str] = set()
    frontier = [name]
    while frontier and len(seen) <= MAX_REGION_NODES:
        tensor = frontier.pop()
        if tensor == source:
            return True
        producer = index.producers.get(tensor)
        if producer is not None and producer.name not in seen:
            seen.add(producer.name)
            frontier += [i for i in producer.input if i]
    return False


def _normalized(index: GraphIndex, squared: list[str]) -> str | None:
    """The tensor whose statistics are the squares of ``squared``: the one the others are computed from
    (the mean's square from x), before a centring x - mean(x). None if there is no such one."""
    x = next((s for s in squared if all(_computed_from(index, other, s) for other in squared)), None)
    producer = index.producers.get(x) if x is not None else None
    if (
        producer is not None
        and producer.op_type == "Sub"
        and _computed_from(index, producer.input[1], producer.input[0])
    ):
        return producer.input[0]
    return x


def _applied(index: GraphIndex, root: onnx.NodeProto, x: str) -> onnx.NodeProto | None:
    """The Mul, or the Div by it, that applies the statistic ``root`` ends (behind a Reciprocal, a scale by
    a constant, reshapes) to a tensor computed from ``x``; None if there is none."""
    name = root.output[0]
    while (node := _only_consumer(index, name, {"Reciprocal", "Mul", "Div", *RESHAPE_OPS})) is not None:
        other = next((i for i in node.input if i != name), None)
        if node.op_type in ("Mul", "Div") and other is not None and not index.is_constant(other):
            applies = node.op_type == "Mul" or node.input[1] == name
            return node if applies and _computed_from(index, other, x) else None
        name = node.output[0]
    return None


def _between(index: GraphIndex, x: str, end: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes on the paths from ``x`` to ``end``, ``end`` included, in graph order; None when ``end``
    reads more than ``MAX_REGION_NODES`` nodes that ``x`` does not cut off from the rest of the graph."""
    ancestors: set[str] = set()
    frontier = [i for i in end.input if i and i != x]
    while frontier:
        producer = index.producers.get(frontier.pop())
        if producer is None or producer.name in ancestors:
            continue
        if len(ancestors) >= MAX_REGION_NODES:
            return None
        ancestors.add(producer.name)
        frontier += [i for i in producer.input if i and i != x]
    reached, members = {x}, []
    for node in index.graph.node:  # topologically sorted
        if node.name in ancestors and any(i in reached for i in node.input):
            members.append(node)
            reached.update(node.output)
    return [*members, end]


def _normalization_at(index: GraphIndex, root: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes of a normalization written out around ``root`` (``_is_root``; see the module), or None."""
    found = _statistic(index, root.input[0])
    if found is None:
        return None
    statistic, squared = found
    x = _normalized(index, squared)
    applied = _applied(index, root, x) if x is not None else None
    region = _between(index, x, applied) if applied is not None else None
    if region is None:  # the statistic alone
        return [*statistic, root]
    affine = _only_consumer(index, applied.output[0], {"Mul", "Add"})
    if affine is not None and affine.op_type == "Mul" and any(_is_constant(index, n) for n in affine.input):
        region.append(affine)
        affine = _only_consumer(index, affine.output[0], {"Add"})
    if affine is not None and affine.op_type == "Add" and any(_is_constant(index, n) for n in affine.input):
        region.append(affine)
    return region


def _base(index: GraphIndex, name: str, bases: dict[str, str], depth: int = MAX_POWER_NODES) -> str:
    """x when ``name`` is c·x^k (k >= 1) by Mul/Div by constants and products of such terms of x; else
    ``name`` itself (k = 1). ``bases`` caches the answers."""
    if name in bases:
        return bases[name]
    producer = index.producers.get(name)
    base = name
    if producer is not None and depth > 0 and producer.op_type in ("Mul", "Div") and len(producer.input) == 2:
        variables = [i for i in producer.input if not index.is_constant(i)]
        if len(variables) == 1 and (producer.op_type == "Mul" or producer.input[0] == variables[0]):
            base = _base(index, variables[0], bases, depth - 1)
        elif producer.op_type == "Mul" and len(variables) == 2:
            found = {_base(index, v, bases, depth - 1) for v in variables}
            base = found.pop() if len(found) == 1 else name
    bases[name] = base
    return base


def _power_at(
    index: GraphIndex, node: onnx.NodeProto, marked: dict[str, str], bases: dict[str, str]
) -> list[onnx.NodeProto] | None:
    """When ``node`` multiplies two terms c·x^k of one x (a power x^k, k >= 2): it and what is computed from
    it and x alone by ``POWER_OPS``, up to the first bounded op (Tanh, Sigmoid, Erf) on each path, leaving
    out ``marked`` nodes. None otherwise."""
    variables = [i for i in node.input if not index.is_constant(i)]
    if node.op_type != "Mul" or len(variables) != 2:
        return None
    x = _base(index, variables[0], bases)
    if _base(index, variables[1], bases) != x:
        return None
    region, computed, frontier = {node.name: node}, set(node.output), list(node.output)
    while frontier and len(region) < MAX_POWER_NODES:
        for reader, _ in index.consumers.get(frontier.pop(), []):
            if reader.name in region or reader.name in marked or reader.op_type not in POWER_OPS:
                continue
            if all(i in computed or i == x for i in reader.input if i and not index.is_constant(i)):
                region[reader.name] = reader
                if reader.op_type not in BOUNDED_OPS:
                    computed.update(reader.output)
                    frontier += list(reader.output)
    return list(region.values())


def _argument_of(index: GraphIndex, log: onnx.NodeProto) -> list[onnx.NodeProto]:
    """``log`` and the nodes its argument is computed by (``ARGUMENT_OPS``, and layers, ``COMPUTE_OPS``, with
    a constant weight), back to the first other op (an activation) or graph input on every path."""
    region = {log.name: log}
    pending = [log.input[0]]
    while pending:
        producer = index.producers.get(pending.pop())
        if producer is None or producer.name in region:
            continue
        linear_layer = producer.op_type in COMPUTE_OPS and index.is_constant(producer.input[1])  # a filterbank
        if producer.op_type not in ARGUMENT_OPS and not linear_layer:
            continue
        region[producer.name] = producer
        data = producer.input if producer.op_type in ARGUMENT_DATA_OPS else producer.input[:1]  # not shapes, axes
        pending += [i for i in data if i and not index.is_constant(i)]
    return list(region.values())


def float_regions(graph: onnx.GraphProto) -> dict[str, str]:
    """Node name → reason, for every main-graph node that must stay float (module docstring)."""
    index = GraphIndex(graph)
    reasons: dict[str, str] = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if _is_root(index, node):
            for member in _normalization_at(index, node) or []:
                reasons.setdefault(member.name, NORMALIZATION_REASON)
        elif node.op_type == "Add":
            for member in _magnitude_at(index, node) or []:
                reasons.setdefault(member.name, MAGNITUDE_REASON)
        elif node.op_type == "Log":
            for member in _argument_of(index, node):
                reasons.setdefault(member.name, LOG_REASON)
        elif node.op_type in RECURRENT_OPS:
            reasons[node.name] = f"recurrent op {node.op_type}: left float"
        elif node.op_type in CONTROL_FLOW_OPS:
            reasons[node.name] = f"{node.op_type} not foldable before run time: its subgraphs stay float"
    bases: dict[str, str] = {}
    for node in graph.node:  # after the regions above, whose squares are theirs
        if node.name not in reasons and node.domain in ("", "ai.onnx"):
            for member in _power_at(index, node, reasons, bases) or []:
                reasons.setdefault(member.name, POWER_REASON)
    return reasons
