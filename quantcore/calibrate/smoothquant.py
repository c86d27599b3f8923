"""SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models", section 4): move the outlier channels of a MatMul's activation into its weight, where
per-channel weight quantization absorbs them, so that the per-tensor activation grid serves the other
channels.

A group is the MatMul/Gemm nodes that read one float activation X as their data operand (input 0, Gemm
without transA) through a float32 initializer weight W read by that node alone (MatMul: rank >= 2).
Every reader of X that is no such node (a residual Add, a MatMul of two activations) is left alone. For
each channel j of X's last axis, the axis the product reduces over:

    m_j = max |X[..., j]|                     over the calibration samples (streamed, one batch at a time)
    r_j = max over the group of max |W_j|     (W_j: row j of W, the weights that multiply channel j)
    s_j = m_j^alpha / r_j^(1-alpha)           (s_j = 1 where m_j = 0 or r_j = 0: nothing to move)
    W_j ← s_j · W_j  for every W of the group,  X_j ← X_j / s_j

A group whose largest m_j is under ``OUTLIER_RATIO`` times its median has no outlier to move and keeps
its graph. X ÷ s is absorbed exactly into X's producer where X is read by the group alone, is no graph
output, and the producer is (``_absorption``):

    LayerNormalization           its scale and bias ÷ s (they multiply the last axis element-wise)
    Mul by a constant            the constant ÷ s (broadcast to the last axis)
    Add of a constant            the constant ÷ s, and the other operand's producer absorbs ÷ s in turn
                                 (a Linear's MatMul + bias Add, a LayerNorm written out as Mul + Add)
    MatMul / Gemm, constant W    its output columns ÷ s (MatMul: W's last axis; Gemm: B's N axis, C too)

A Conv's output channels are its axis 1, never the last axis a MatMul reduces over, so a Conv producer
does not absorb. Elsewhere (X also read by a residual, X a graph input, a Gelu before it) a Mul by the
constant 1/s is inserted before the group: exact as well, at the cost of one element-wise pass. ONNX
Runtime runs it as its own Mul before the QuantizeLinear (float: the onnxruntime platform keeps a Mul by
a constant spread over more than 2x float, ``annotate/platforms/onnxruntime.py``; no QDQ fusion absorbs
it). TensorRT builds it as a pointwise layer, which its builder may fuse with the neighbouring
element-wise layers (its fusion catalog); not measured on a GPU here.

alpha is chosen per model from ``ALPHAS`` as ``quantcore.calibrate.clip_search`` chooses a clip: each
candidate's smoothed model is annotated, calibrated and exported as exact Q/DQ on the first
``SEARCH_SAMPLES`` calibration samples, and the one whose worst float output comes closest to FP32 (SQNR)
is kept; the unsmoothed model competes too, and keeps its graph when no alpha beats it. Every s comes from
the original weights and statistics, so the groups' rescalings commute. The smoothed FP32 model computes
the same function, to the float32 rounding of the rescaled constants.
Cost: one FP32 pass over the calibration data for m, one over the search samples for the reference, and
per candidate (alpha and the unsmoothed model) one calibration and one exact Q/DQ run on those samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import numpy_helper

from quantcore.annotate.annotation import annotate
from quantcore.calibrate.calibration import calibrate
from quantcore.calibrate.clip_search import worst_sqnr
from quantcore.config import QuantizeConfig
from quantcore.export.qdq import build_qdq_model
from quantcore.graph.index import GraphIndex, NameScope
from quantcore.numerics.metrics import OutputAgreement
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import EXPOSED_BYTES_PER_BATCH, Batches
from quantcore.runtime.session import open_session
from quantcore.wording import counted

STAGE = "prepare"
ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# max_j m_j / median_j m_j from which a group is smoothed: below it, per-tensor quantization of X loses
# under 3 bits to its largest channel, and an inserted Mul would cost time for little
OUTLIER_RATIO = 8.0
SEARCH_SAMPLES = 32
LAYERS = frozenset({"MatMul", "Gemm"})


@dataclass(frozen=True)
class Group:
    """The layers reading activation ``input`` that share one s; ``absorbed``: the initializers that take
    ÷ s as (name, axis of the s vector: -1 broadcasts along the last axis, 0 along the first), or None
    when a Mul by 1/s is inserted."""

    input: str
    layers: tuple[str, ...]  # node names, graph order
    absorbed: tuple[tuple[str, int], ...] | None


@dataclass(frozen=True)
class Smoothing:
    """What ``smooth`` did: the groups smoothed (none when the unsmoothed model won), the alpha kept (None:
    none), every candidate's worst output SQNR in dB (key None: the unsmoothed model) on ``samples``
    calibration samples, and each group's outlier ratio max m / median m."""

    groups: tuple[Group, ...]
    alpha: float | None
    scores: dict[float | None, float]
    samples: int
    ratios: dict[str, float]

    def statement(self) -> str:
        if self.alpha is None:
            if not self.ratios:
                return "smoothquant: no layer with outlier channels"
            groups = counted(len(self.ratios), "outlier group")
            return f"smoothquant: {groups}, none smoothed (no alpha beat the unsmoothed model)"
        layers = sum(len(g.layers) for g in self.groups)
        inserted = sum(g.absorbed is None for g in self.groups)
        smoothed = f"{counted(layers, 'layer')} smoothed in {counted(len(self.groups), 'group')}"
        return (
            f"smoothquant: {smoothed}, alpha = {self.alpha:g} "
            f"({self.scores[self.alpha]:.1f} dB vs {self.scores[None]:.1f} dB unsmoothed on {self.samples} "
            f"calibration samples; {inserted} Mul inserted)"
        )


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _own_float_initializer(index: GraphIndex, name: str) -> bool:
    return index.is_initializer(name) and index.is_float32(name, unknown=False) and len(index.consumers[name]) == 1


def _is_layer(node: onnx.NodeProto, index: GraphIndex) -> bool:
    """A MatMul/Gemm reading an activation through a weight of its own (module docstring)."""
    if node.op_type not in LAYERS or len(node.input) < 2 or index.is_constant(node.input[0]):
        return False
    if not (index.is_float32(node.input[0], unknown=True) and _own_float_initializer(index, node.input[1])):
        return False
    if node.op_type == "Gemm":
        return not _attributes(node).get("transA", 0)
    return len(index.initializers[node.input[1]].dims) >= 2


def _absorption(index: GraphIndex, tensor: str) -> list[tuple[str, int]] | None:
    """The initializers (name, axis) whose division by s divides ``tensor`` by s along its last axis,
    exactly (module table), or None. ``tensor``'s readers are checked by the caller."""
    producer = index.producers.get(tensor)
    if producer is None or tensor in index.graph_outputs or producer.output[0] != tensor:
        return None  # (a LayerNormalization's mean and inverse deviation outputs do not scale with it)
    op, inputs = producer.op_type, [name for name in producer.input if name]
    if op == "LayerNormalization" and all(_own_float_initializer(index, n) for n in inputs[1:]):
        return [(name, -1) for name in inputs[1:]]
    if op in ("Mul", "Add") and len(inputs) == 2:
        constants = [n for n in inputs if _own_float_initializer(index, n)]
        others = [n for n in inputs if n not in constants]
        if len(constants) != 1 or len(others) != 1:
            return None
        if op == "Mul":
            return [(constants[0], -1)]
        readers = index.consumers.get(others[0], [])
        inner = _absorption(index, others[0]) if len(readers) == 1 else None
        return None if inner is None else [(constants[0], -1), *inner]
    if op == "MatMul" and _is_layer(producer, index):
        return [(producer.input[1], -1)]  # (..., K, N): output columns on the last axis
    if op == "Gemm" and _is_layer(producer, index):
        bias = [(name, -1) for name in inputs[2:3]]
        if bias and not _own_float_initializer(index, bias[0][0]):
            return None
        return [(producer.input[1], 0 if _attributes(producer).get("transB", 0) else -1), *bias]
    return None


def find_groups(graph: onnx.GraphProto) -> list[Group]:
    """Every group of the module docstring, in graph order of its first layer, before any statistics."""
    index = GraphIndex(graph)
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        if _is_layer(node, index):
            readers.setdefault(node.input[0], []).append(node.name)
    groups = []
    for tensor, layers in readers.items():
        alone = len(index.consumers[tensor]) == len(layers)  # X read by the group alone
        absorbed = _absorption(index, tensor) if alone else None
        groups.append(Group(tensor, tuple(layers), None if absorbed is None else tuple(absorbed)))
    return groups


def _weight_rows(node: onnx.NodeProto, weight: np.ndarray) -> np.ndarray:
    """(K,) max |W_j| over the weights that multiply channel j of the data operand."""
    if node.op_type == "Gemm" and _attributes(node).get("transB", 0):
        return np.abs(weight).max(axis=0)  # B is (N, K)
    return np.abs(np.moveaxis(weight, -2, 0)).reshape(weight.shape[-2], -1).max(axis=1)  # (..., K, N)


def channel_maxima(
    prepared: PreparedModel, tensors: list[str], batches: Batches, config: QuantizeConfig, monitor: Monitor
) -> dict[str, np.ndarray]:
    """tensor → (C,) max |X[..., j]| over ``batches``, each batch reduced as soon as it is run (ONNX Runtime
    returns the exposed tensors of one batch at a time; batches whose exposed tensors would pass
    ``EXPOSED_BYTES_PER_BATCH`` are split, as calibration's are). Checks for cancellation before each batch."""
    graph_inputs = set(GraphIndex(prepared.model.graph).graph_inputs)
    fetched = [name for name in tensors if name not in graph_inputs]
    maxima: dict[str, np.ndarray] = {}
    with open_session(prepared.model, device=config.device, outputs=fetched) as session:
        if fetched:
            exposed, samples = batches.probe(lambda batch: sum(a.nbytes for a in session.run(fetched, batch)))
            batches = batches.within(exposed // samples, EXPOSED_BYTES_PER_BATCH)
        for batch in batches:
            monitor.check(STAGE)
            values = dict(zip(fetched, session.run(fetched, dict(batch)), strict=True)) if fetched else {}
            values.update((name, batch[name]) for name in tensors if name in graph_inputs)
            for name in tensors:
                x = values[name]
                per_channel = np.abs(x.reshape(-1, x.shape[-1])).max(axis=0).astype(np.float64)
                maxima[name] = np.maximum(maxima[name], per_channel) if name in maxima else per_channel
            del values
    return maxima


def smoothing_scales(index: GraphIndex, group: Group, maxima: np.ndarray, alpha: float) -> np.ndarray:
    """(C,) s_j = m_j^alpha / r_j^(1-alpha) of ``group`` (module docstring), 1 where m_j or r_j is 0."""
    nodes = {node.name: node for node in index.graph.node}
    rows = np.max([_weight_rows(nodes[n], index.array(nodes[n].input[1])) for n in group.layers], axis=0)
    scale = np.ones_like(maxima)
    live = (maxima > 0) & (rows > 0)
    scale[live] = maxima[live] ** alpha / rows[live] ** (1.0 - alpha)
    return scale


def apply_smoothing(
    prepared: PreparedModel, groups: list[Group], maxima: Mapping[str, np.ndarray], alpha: float
) -> PreparedModel:
    """``prepared`` with ``groups`` smoothed at ``alpha`` (module docstring), in a copy of its model."""
    graph = prepared.model.graph
    index = GraphIndex(graph)
    nodes = {node.name: node for node in graph.node}
    positions = {node.name: i for i, node in enumerate(graph.node)}
    values: dict[str, np.ndarray] = {}  # initializer → its float64 value as rescaled so far

    def rescale(name: str, factor: np.ndarray, axis: int) -> None:
        value = values[name] if name in values else index.array(name).astype(np.float64)
        values[name] = value * (factor.reshape(-1, 1) if axis == 0 else factor)  # broadcast as ONNX would

    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    scope = NameScope(index.used_names())
    inserted: list[tuple[int, onnx.NodeProto]] = []  # (position of the group's first layer, its Mul)
    value_infos = {v.name: v for v in [*graph.input, *graph.value_info]}
    for group in groups:
        scale = smoothing_scales(index, group, maxima[group.input], alpha)
        for layer in group.layers:  # W_j ← s_j · W_j
            node = nodes[layer]
            if node.op_type == "Gemm" and _attributes(node).get("transB", 0):
                rescale(node.input[1], scale, -1)  # B is (N, K)
            else:
                rescale(node.input[1], scale[:, None], -1)  # (..., K, N)
        if group.absorbed is not None:
            for name, axis in group.absorbed:
                rescale(name, 1.0 / scale, axis)
            continue
        smoothed = scope.fresh(f"{group.input}.smoothed")
        reciprocal = scope.fresh(f"{group.input}.smoothing")
        model.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), reciprocal))
        mul = onnx.helper.make_node(
            "Mul", [group.input, reciprocal], [smoothed], name=scope.fresh(f"{group.input}.smooth")
        )
        inserted.append((min(positions[n] for n in group.layers), mul))
        for node in model.graph.node:
            if node.name in group.layers:
                node.input[0] = smoothed
        if group.input in value_infos:
            info = model.graph.value_info.add()
            info.CopyFrom(value_infos[group.input])
            info.name = smoothed
    for position, mul in sorted(inserted, key=lambda item: item[0], reverse=True):
        model.graph.node.insert(position, mul)  # from the back: earlier positions stay valid
    for tensor in model.graph.initializer:
        if tensor.name in values:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name].astype(np.float32), tensor.name))
    return replace(prepared, model=model)


def _quantized_sqnr(
    prepared: PreparedModel, samples: Batches, reference: list[list[np.ndarray]], config: QuantizeConfig
) -> float:
    """The worst float output's SQNR (dB) of ``prepared`` annotated, calibrated on ``samples`` and run as
    exact Q/DQ on them, against ``reference`` (FP32's outputs of the same batches)."""
    calibrated = calibrate(prepared, annotate(prepared, config), samples, config)
    outputs = [o.name for o in prepared.model.graph.output]
    agreements = {name: OutputAgreement(argmax=False) for name in outputs}
    with open_session(build_qdq_model(prepared, calibrated), device=config.device, exact_qdq=True) as session:
        for batch, expected in zip(samples, reference, strict=True):
            for name, x, y in zip(outputs, expected, session.run(outputs, batch), strict=True):
                agreements[name].update(x, y)
    return worst_sqnr({name: a for name, a in agreements.items() if a.elements})  # float outputs


def smooth(
    prepared: PreparedModel, batches: Batches, config: QuantizeConfig, monitor: Monitor | None = None
) -> tuple[PreparedModel, Smoothing]:
    """``prepared`` with its outlier groups smoothed at the alpha that quantizes best (module docstring), or
    ``prepared`` itself when no group has outliers or no alpha beats the unsmoothed model. ``batches``: the
    calibration data for the prepared model. Reports progress per candidate, checks for cancellation."""
    monitor = monitor or Monitor()
    groups = find_groups(prepared.model.graph)
    maxima = channel_maxima(prepared, [g.input for g in groups], batches, config, monitor) if groups else {}
    ratios = {}
    for group in groups:
        median = float(np.median(maxima[group.input]))
        ratios[group.input] = float(np.max(maxima[group.input])) / median if median > 0 else float("inf")
    groups = [g for g in groups if ratios[g.input] >= OUTLIER_RATIO]
    ratios = {g.input: ratios[g.input] for g in groups}
    if not groups:
        return prepared, Smoothing((), None, {}, 0, {})

    samples = batches.first(SEARCH_SAMPLES)
    outputs = [o.name for o in prepared.model.graph.output]
    with open_session(prepared.model, device=config.device) as session:
        reference = [session.run(outputs, batch) for batch in samples]
    candidates: dict[float | None, PreparedModel] = {None: prepared}
    candidates.update((alpha, apply_smoothing(prepared, groups, maxima, alpha)) for alpha in ALPHAS)
    scores: dict[float | None, float] = {}
    for i, (alpha, candidate) in enumerate(candidates.items()):
        monitor.check(STAGE)
        scores[alpha] = _quantized_sqnr(candidate, samples, reference, config)
        label = "unsmoothed" if alpha is None else f"smoothquant alpha = {alpha:g}"
        monitor.report(STAGE, (i + 1) / len(candidates), f"{label}: {scores[alpha]:.1f} dB")
    best = max(scores, key=lambda a: (scores[a], a is None))  # ties: the graph as it was
    kept = tuple(groups) if best is not None else ()
    return candidates[best], Smoothing(kept, best, scores, samples.num_samples, ratios)
