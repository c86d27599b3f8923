"""The graph-wise measurements of the analysis (``quantcore.analysis.ranking``), reduced inside the run.

For every quantized activation t (x = its FP32 value, x̂ = its dequantized value in the exported model):
its range statistics (``quantcore.analysis.ranges``), its local error Σ(x - Q/DQ(x))² and its graph-wise
error Σ(x - x̂)² against Σx². x and x̂ come from two different runs of the switchable model
(``quantcore.analysis.switch``): every flag off, every flag on. Fetched as graph outputs, every activation
of a batch was held twice or three times over (1.6 GB a sample on a YOLO11s-seg at 640x640), so one run
now computes both: the *twin* model holds the switchable graph twice over the same initializers, one copy
(its nodes' outputs renamed, its mask a second input) run with every flag off and the other with every
flag on, and reduces each activation to seven scalars as soon as both copies have computed it (min, max,
element count, the values the grid saturates, Σx², the two error sums). A batch's run fetches only
those, and runs in ONNX Runtime's priority-based order (``open_session(in_node_order=True)``), which
keeps to that layout: memory holds the two copies' working activations, as an inference does, never an
exposed tensor.

The sums are float32 within a batch (ONNX Runtime's reductions) and float64 across batches: on that
YOLO11s-seg (tensorrt preset, 238 activations) the SQNRs moved by at most 0.002 dB against float64 sums
of the fetched tensors, the ranges and saturated counts not at all. A non-finite sum (an infinite or NaN
value) leaves the SQNR unmeasured (None), as ``quantcore.numerics.metrics`` does for a non-finite output.
Measured on that model (onnxruntime preset, 359 activations, 8 samples of one image): the graph-wise
runs 32.7 → 17.2 s, the analysis' peak resident memory 4353 → 1900 MB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore.analysis.ranges import RangeStats
from quantcore.analysis.switch import MASK_INPUT, SwitchableModel
from quantcore.annotate.annotation import Annotation
from quantcore.graph.index import GraphIndex, NameScope, rename_reads
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session

# the scalars reduced from each activation, in the order of ``Twin.outputs[t]``
SCALARS = ("minimum", "maximum", "total", "clipped", "sum_x2", "local_e2", "graphwise_e2")
FLOAT_COPY_SUFFIX = "_fp32"
# ONNX Runtime 1.32's TransposeOptimizer, which runs at the exact sessions' basic level, breaks the twin of a
# tf2onnx model (AFIS's LEADER minutiae extractor, NHWC input): a Sub of an activation's two copies then
# meets (8, 16, 64, 64) and (8, 64, 64, 16) and the run fails; moving transposes is no arithmetic, so the
# twin runs without it (``tests/quantcore/test_analysis.py``)
TWIN_DISABLED_OPTIMIZERS = ("TransposeOptimizer",)


@dataclass(frozen=True)
class Twin:
    model: onnx.ModelProto
    off_mask: str  # the float copy's mask input
    outputs: Mapping[str, tuple[str, ...]]  # activation -> its scalars' output names, as ``SCALARS``


def make_twin(switchable: SwitchableModel, annotation: Annotation) -> Twin:
    """The twin (see module) of ``switchable``'s quantized activations, made of its model in place (no
    second copy of the weights: the graph-wise runs are that model's last use). Each float node follows
    its original and each activation's reductions follow its dequantized value in both copies, so that a
    run (in node order) frees what it has reduced as an inference would."""
    model = switchable.model
    graph = model.graph
    scope = NameScope(GraphIndex(graph).used_names())
    off_mask = scope.fresh(f"{MASK_INPUT}{FLOAT_COPY_SUFFIX}")
    renamed = {MASK_INPUT: off_mask}
    for node in graph.node:
        renamed.update({name: scope.fresh(f"{name}{FLOAT_COPY_SUFFIX}") for name in node.output if name})
    measured = [t for t in annotation.activations if t in switchable.dequantized]
    reduced_after = {switchable.dequantized[t]: t for t in measured}
    outputs: dict[str, tuple[str, ...]] = {}
    ordered: list[onnx.NodeProto] = []
    for node in graph.node:
        ordered += [node, _copy(node, renamed, scope)]
        for t in (reduced_after[name] for name in node.output if name in reduced_after):
            x, local, quantized = renamed.get(t, t), renamed[switchable.dequantized[t]], switchable.dequantized[t]
            nodes, outputs[t] = _reductions(t, x, local, quantized, RangeStats(annotation.configs[t]), scope, graph)
            ordered += nodes
    del graph.node[:]
    graph.node.extend(ordered)
    mask = next(i for i in graph.input if i.name == MASK_INPUT)
    graph.input.append(onnx.ValueInfoProto(name=off_mask, type=mask.type))
    del graph.output[:]
    outputs = {t: outputs[t] for t in measured}  # the annotation's order
    graph.output.extend(onnx.ValueInfoProto(name=name) for names in outputs.values() for name in names)
    return Twin(model, off_mask, outputs)


def _copy(node: onnx.NodeProto, renamed: Mapping[str, str], scope: NameScope) -> onnx.NodeProto:
    """``node`` of the float copy: its outputs, and the inputs produced in the main graph, renamed (also
    inside its subgraphs, which may read outer tensors; their own names stay, a sibling scope's)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    if node.name:
        copy.name = scope.fresh(f"{node.name}{FLOAT_COPY_SUFFIX}")
    copy.output[:] = [renamed.get(name, name) for name in node.output]
    rename_reads(copy, renamed)
    return copy


def _reductions(
    t: str, x: str, local: str, quantized: str, stats: RangeStats, scope: NameScope, graph: onnx.GraphProto
) -> tuple[list[onnx.NodeProto], tuple[str, ...]]:
    """Nodes reducing activation ``t`` (FP32 value ``x``, its Q/DQ ``local``, the exported model's
    ``quantized``) to the ``SCALARS``."""
    nodes: list[onnx.NodeProto] = []

    def add(op: str, inputs: list[str], what: str, **attributes: Any) -> str:
        out = scope.fresh(f"{t}_analysis_{what}")
        nodes.append(helper.make_node(op, inputs, [out], name=scope.fresh(out), **attributes))
        return out

    def constant(value: np.ndarray, what: str) -> str:
        name = scope.fresh(f"{t}_analysis_{what}")
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    minimum = add("ReduceMin", [x], "min", keepdims=0)
    maximum = add("ReduceMax", [x], "max", keepdims=0)
    total = add("Size", [x], "total")
    if stats.tqc.dynamic:  # nothing saturates a range taken from each value itself
        clipped = constant(np.array(0, np.int64), "clipped")
    else:
        if stats.tqc.per_channel:  # every platform quantizes activations per tensor (``rules.operand``)
            raise ValueError(f"activation {t!r} has a per-channel config: the analysis reduces per-tensor ranges")
        lo = constant(np.asarray(stats.saturate_lo, np.float32), "saturate_lo")
        hi = constant(np.asarray(stats.saturate_hi, np.float32), "saturate_hi")
        outside = add("Or", [add("Less", [x, lo], "below"), add("Greater", [x, hi], "above")], "outside")
        counted = add("Cast", [outside], "outside_count", to=TensorProto.INT64)
        clipped = add("ReduceSum", [counted], "clipped", keepdims=0)
    sum_x2 = add("ReduceSumSquare", [x], "sum_x2", keepdims=0)
    local_e2 = add("ReduceSumSquare", [add("Sub", [x, local], "local_error")], "local_e2", keepdims=0)
    graphwise_e2 = add("ReduceSumSquare", [add("Sub", [x, quantized], "graphwise_error")], "graphwise_e2", keepdims=0)
    return nodes, (minimum, maximum, total, clipped, sum_x2, local_e2, graphwise_e2)


class _Sums:
    """One activation's scalars, summed over the batches."""

    def __init__(self) -> None:
        self.sum_x2 = self.local_e2 = self.graphwise_e2 = 0.0

    def add(self, sum_x2: float, local_e2: float, graphwise_e2: float) -> None:
        self.sum_x2 += sum_x2
        self.local_e2 += local_e2
        self.graphwise_e2 += graphwise_e2

    def sqnr_db(self, sum_e2: float) -> float | None:
        if not (math.isfinite(self.sum_x2) and math.isfinite(sum_e2)) or self.sum_x2 <= 0 or sum_e2 <= 0:
            return None
        return 10.0 * math.log10(self.sum_x2 / sum_e2)


def graphwise_rows(
    switchable: SwitchableModel,
    annotation: Annotation,
    batches: Batches,
    device: str,
    *,
    check: Callable[[], None],
    step: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Rows of the quantized activations, one run of the twin per batch; ``check`` before each batch
    (it may raise ``Canceled``), ``step`` after."""
    twin = make_twin(switchable, annotation)
    if not twin.outputs:  # nothing to measure (and a graph without outputs would not load)
        return []
    stats = {t: RangeStats(annotation.configs[t]) for t in twin.outputs}
    sums = {t: _Sums() for t in twin.outputs}
    fetched = [name for names in twin.outputs.values() for name in names]
    on, off = np.ones(len(switchable.layers), bool), np.zeros(len(switchable.layers), bool)
    with open_session(
        twin.model, device=device, exact_qdq=True, in_node_order=True, disabled_optimizers=TWIN_DISABLED_OPTIMIZERS
    ) as session:
        for i, batch in enumerate(batches):
            check()
            values = iter(session.run(fetched, {**batch, MASK_INPUT: on, twin.off_mask: off}))
            for t in twin.outputs:
                scalars = (next(values).item() for _ in SCALARS)
                minimum, maximum, total, clipped, sum_x2, local_e2, graphwise_e2 = scalars
                stats[t].add(minimum, maximum, clipped, total)
                sums[t].add(sum_x2, local_e2, graphwise_e2)
            step(f"graph-wise batch {i + 1}/{len(batches)}")
    return [
        {
            "tensor": t,
            "kind": "activation",
            "graphwise_sqnr_db": sums[t].sqnr_db(sums[t].graphwise_e2),
            "local_sqnr_db": sums[t].sqnr_db(sums[t].local_e2),
            **stats[t].result(),
            "channel_range_ratio": None,
        }
        for t in twin.outputs
    ]
