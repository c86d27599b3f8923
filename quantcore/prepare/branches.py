"""Folding ``If`` nodes whose condition is known before the model runs: the taken branch is inlined
into the main graph, so that annotation (which walks only the main graph) can quantize it.

A condition is known when

- it is a constant (an initializer, a Constant, or folded from them: ``quantcore.prepare.folding``); or
- a ``sample`` of the given data is supplied and the condition depends on that data only through
  tensor *shapes* (Shape/Size) or through the values of non-float inputs (a sample-rate or mode
  flag): ONNX Runtime evaluates it on the sample. The folded model then assumes those shapes and
  flags, which ``PreparedModel.warnings`` states. A condition that reads the values of float data is
  never folded.

Inlining the branch ``B`` of ``If(cond) -> (o_1..o_k)``:

- every name ``B`` defines (node outputs, initializers) gets a fresh main-graph name, applied to the
  inputs and outputs of ``B``'s nodes and inside their own subgraphs;
- names ``B`` reads from the outer scope keep their names (they are visible in the main graph);
- branch output ``y_i`` becomes ``o_i``: renamed directly when a branch node produces it, else
  through an Identity node (an outer-scope or initializer output, or the same tensor output twice);
- the inlined nodes take the If node's place in the node list, which keeps the list topologically
  sorted (the If already came after every producer its branch reads).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from quantcore.graph.index import NameScope, node_subgraphs, rename_reads
from quantcore.runtime.session import open_session

SHAPE_OPS = frozenset({"Shape", "Size"})  # ops whose output reads only the input's shape


def branch(node: onnx.NodeProto, taken: bool) -> onnx.GraphProto:
    """The ``then_branch`` (taken=True) or ``else_branch`` subgraph of an If node."""
    wanted = "then_branch" if taken else "else_branch"
    for attribute in node.attribute:
        if attribute.name == wanted:
            return attribute.g
    raise ValueError(f"If node {node.name!r} has no {wanted}")


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name in ``graph`` and its subgraphs (for collision-free renaming)."""
    names = {t.name for t in graph.initializer} | {v.name for v in [*graph.input, *graph.output]}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for subgraph in node_subgraphs(node):
            names |= all_names(subgraph)
    names.discard("")
    return names


def inline_branch(graph: onnx.GraphProto, node: onnx.NodeProto, taken: bool, scope: NameScope) -> int:
    """Replace the If ``node`` of ``graph`` by the nodes of its taken branch (rules in the module
    docstring); returns the number of nodes inlined. Mutates ``graph``."""
    body = branch(node, taken)
    produced = {name for inner in body.node for name in inner.output if name}
    rename: dict[str, str] = {}
    outputs = list(node.output)
    identities: list[tuple[str, str]] = []  # (branch output, If output) joined by an Identity
    claimed: set[str] = set()
    for branch_output, outer_output in zip(body.output, outputs, strict=False):
        if not outer_output:
            continue
        if branch_output.name in produced and branch_output.name not in claimed:
            rename[branch_output.name] = outer_output
            claimed.add(branch_output.name)
        else:
            identities.append((branch_output.name, outer_output))
    for name in [*produced, *(t.name for t in body.initializer)]:
        if name not in rename:
            rename[name] = scope.fresh(name)

    inlined: list[onnx.NodeProto] = []
    for inner in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = scope.fresh(inner.name or f"{node.name}/{inner.op_type}")
        copy.output[:] = [rename.get(name, name) for name in copy.output]
        rename_reads(copy, rename)
        inlined.append(copy)
    for source, target in identities:
        inlined.append(
            helper.make_node(
                "Identity", [rename.get(source, source)], [target], name=scope.fresh(f"{node.name}/Identity")
            )
        )
    for tensor in body.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name = rename[tensor.name]
        graph.initializer.append(copy)

    # by name: rewriting the node list copies the messages, so an earlier reference may be stale
    position = next(i for i, n in enumerate(graph.node) if n.name == node.name)
    kept = [*graph.node[:position], *inlined, *graph.node[position + 1 :]]
    del graph.node[:]
    graph.node.extend(kept)
    return len(inlined)


def constant_condition(value: np.ndarray) -> bool | None:
    """An If condition's truth value: a single-element tensor; None if it isn't one."""
    value = np.asarray(value)
    if value.size != 1:
        return None
    return bool(value.reshape(()))


def fold_constant_branches(graph: onnx.GraphProto, constants: Mapping[str, np.ndarray]) -> list[str]:
    """Inline every main-graph If whose condition is in ``constants``; returns the folded node names."""
    scope = NameScope(all_names(graph))
    folded = []
    for name in [n.name for n in graph.node if n.op_type == "If" and n.domain in ("", "ai.onnx")]:
        node = next(n for n in graph.node if n.name == name)
        if node.input[0] not in constants:
            continue
        taken = constant_condition(constants[node.input[0]])
        if taken is None:
            continue
        inline_branch(graph, node, taken, scope)
        folded.append(node.name)
    return folded


def data_dependencies(graph: onnx.GraphProto, name: str) -> tuple[set[str], set[str]]:
    """Graph inputs that tensor ``name`` depends on, split into (by value, by shape only): the walk
    back from ``name`` stops at Shape/Size nodes, whose inputs count as shape-only dependencies."""
    producers = {o: n for n in graph.node for o in n.output if o}
    inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    by_value: set[str] = set()
    by_shape: set[str] = set()
    stack = [(name, False)]
    seen: set[tuple[str, bool]] = set()
    while stack:
        current, shape_only = stack.pop()
        if (current, shape_only) in seen:
            continue
        seen.add((current, shape_only))
        if current in inputs:
            (by_shape if shape_only else by_value).add(current)
            continue
        producer = producers.get(current)
        if producer is None:
            continue
        through_shape = shape_only or producer.op_type in SHAPE_OPS
        for source in producer.input:
            if source:
                stack.append((source, through_shape))
    return by_value, by_shape - by_value


def evaluate_on_sample(
    model: onnx.ModelProto, names: list[str], sample: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Values of main-graph tensors ``names`` when ONNX Runtime runs ``model`` on ``sample`` (one
    batch of every graph input). The tensors are exposed as extra graph outputs of a copy."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {o.name for o in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in existing)
    inputs = [i.name for i in copy.graph.input if i.name not in {t.name for t in copy.graph.initializer}]
    feeds = {name: np.asarray(sample[name]) for name in inputs}
    with open_session(copy) as session:
        values = session.run(names, feeds)
    return dict(zip(names, values, strict=True))


def fold_sample_branches(
    model: onnx.ModelProto, sample: Mapping[str, np.ndarray], float_inputs: set[str]
) -> tuple[list[str], list[str]]:
    """Inline main-graph Ifs whose condition depends on ``sample`` only through shapes or non-float
    input values (``float_inputs`` names the float ones). Returns (folded If names, messages for
    the report, one per folded or refused If)."""
    graph = model.graph
    candidates: list[onnx.NodeProto] = []
    messages: list[str] = []
    for node in graph.node:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        by_value, by_shape = data_dependencies(graph, node.input[0])
        data_values = sorted(by_value & float_inputs)
        if data_values:
            messages.append(
                f"If {node.name!r} left in place: its condition reads the values of float input(s) "
                f"{data_values}; both branches stay float"
            )
            continue
        if not (by_value | by_shape) <= set(sample):
            continue
        candidates.append(node)
    if not candidates:
        return [], messages
    try:
        values = evaluate_on_sample(model, [n.input[0] for n in candidates], sample)
    except Exception as error:  # the model may not run on the sample; the Ifs then stay
        messages.append(f"If conditions could not be evaluated on the sample: {str(error).strip()[:200]}")
        return [], messages
    scope = NameScope(all_names(graph))
    folded = []
    for name in [n.name for n in candidates]:
        node = next(n for n in graph.node if n.name == name)
        taken = constant_condition(values[node.input[0]])
        if taken is None:
            continue
        by_value, by_shape = data_dependencies(graph, node.input[0])
        inline_branch(graph, node, taken, scope)
        folded.append(node.name)
        depends = [f"the shape of {sorted(by_shape)}"] if by_shape else []
        depends += [f"the value of {sorted(by_value)}"] if by_value else []
        messages.append(
            f"If {node.name!r} folded to its {'then' if taken else 'else'} branch, evaluated on the "
            f"given data: the quantized model assumes {' and '.join(depends) or 'nothing'} as in that data"
        )
    return folded, messages
