"""Sequential calibration, one segment of the graph at a time (GPTQ's, Frantar et al. 2022, section 5:
each layer's input X taken from the model whose earlier layers are already quantized; AWQ's search too),
so that a model is never held whole and only the Grams of one segment's layers exist at once.

``plan`` cuts the graph's nodes, in their (topological) order, where the fewest activations cross: a
tensor made by a node before the cut and read by a node after it (initializers and graph inputs never
count, nor a graph output no later node reads: the run needs only the layers' inputs). Among the
positions with a quantized layer on both sides, those crossed by the fewest tensors are the cuts, and a
cut that would leave a segment without a layer is dropped; a pre-norm transformer is cut on its residual
stream, after each attention and after each MLP. A graph with no such position (one layer, layers side
by side, nodes not in topological order) is one segment. The last segment ends at its last layer.

``run`` then takes each segment in turn over the calibration batches:

1. the segment alone (its initializers read through the ``TensorReader``: from the model or from its
   external-data file) runs on its inputs with each layer input as an extra output, and each input's
   XᵀX and Σ|x| are summed (``GramSum``);
2. its layers are quantized by a ``SegmentQuantizer``, one at a time as the caller takes them: GPTQ's
   (``layer_by_layer``) frees each Gram after its last layer; AWQ's searches the segment's groups first;
3. the segment runs again with each layer's weight replaced by the weight it computes with once
   quantized (float32: GPTQ's ŵ, AWQ's diag(1/s)·ŵ), and the outputs later segments read replace, batch
   by batch, the activations no later segment reads.

What is held: one segment's initializers (in its ONNX Runtime session) and its Grams, and the
activations that cross the current cut for every calibration batch (for a decoder: samples by tokens by
d_model float32). With one segment, step 1 runs the whole model once over the batches and step 3 is not
run.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantcore.graph.index import subgraph_references
from quantcore.graph.protobuf import copy_fields
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session
from quantcore.weight_only.gram import Gram, GramSum
from quantcore.weight_only.layers import WeightLayer
from quantcore.weight_only.tensors import TensorReader, is_external
from quantcore.weight_only.writer import QuantizedLayer

STAGE = "export"
T = TypeVar("T")


@dataclass(frozen=True)
class Segment:
    """Nodes [start, stop) of the graph, the quantized layers among them (graph order), the tensors it
    reads that were made before it (graph inputs and earlier segments' outputs) and those it makes that a
    later segment reads."""

    start: int
    stop: int
    layers: tuple[WeightLayer, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


SegmentQuantizer = Callable[[Segment, dict[str, GramSum]], Iterator[tuple[T, WeightLayer, np.ndarray]]]
"""Quantizes one segment's layers given the Grams of their inputs (by input tensor; it may free them as it
goes): yields, for each layer in turn, its result, the layer and the (K, N) weight the layer computes with
once quantized, which the next segments' inputs are computed from."""


def _reads(node: onnx.NodeProto) -> set[str]:
    return {name for name in node.input if name} | subgraph_references(node)


def plan(model: onnx.ModelProto, layers: Sequence[WeightLayer]) -> list[Segment]:
    """The segments of ``model`` (module docstring); ``layers`` in graph order, all nodes of ``model``."""
    nodes = list(model.graph.node)
    position = {node.name: i for i, node in enumerate(nodes)}
    at = [position[layer.node] for layer in layers]
    made = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    last_use: dict[str, int] = {}
    ordered = True
    for i, node in enumerate(nodes):
        for name in _reads(node) & made.keys():
            ordered &= made[name] < i
            last_use[name] = i
    cuts: list[int] = []
    if ordered and len(layers) > 1:
        # crossing[c]: the tensors made before node c and read at or after it
        crossing = np.zeros(len(nodes) + 1, dtype=np.int64)
        for name, use in last_use.items():
            crossing[made[name] + 1] += 1
            crossing[use + 1] -= 1
        crossing = np.cumsum(crossing)
        candidates = range(min(at) + 1, max(at) + 1)  # a layer on both sides
        fewest = min((int(crossing[c]) for c in candidates), default=0)
        for c in candidates:
            if crossing[c] == fewest and any((cuts[-1] if cuts else 0) <= i < c for i in at):
                cuts.append(c)
    bounds = [0, *cuts, max(at) + 1]
    initializers = {tensor.name for tensor in model.graph.initializer}
    graph_inputs = {value.name for value in model.graph.input} - initializers  # an old model lists both
    spans = list(itertools.pairwise(bounds))
    inputs = []
    for start, stop in spans:
        read = set().union(*(_reads(nodes[i]) for i in range(start, stop)))
        inputs.append(tuple(sorted(n for n in read if made.get(n, -1) < start and (n in made or n in graph_inputs))))
    segments = []
    for index, (start, stop) in enumerate(spans):
        later = set().union(*inputs[index + 1 :])
        outputs = tuple(sorted(n for n in later if start <= made.get(n, -1) < stop))
        members = tuple(layer for layer, i in zip(layers, at, strict=True) if start <= i < stop)
        segments.append(Segment(start, stop, members, inputs[index], outputs))
    return segments


def segment_model(
    model: onnx.ModelProto,
    segment: Segment,
    reader: TensorReader,
    dtypes: Mapping[str, np.dtype],
    outputs: Sequence[str],
    weights: Mapping[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    """The segment's nodes as a model of their own: its inputs typed as ``model`` declares them or by
    ``dtypes`` (the arrays it will be fed), ``outputs`` untyped, the initializers its nodes read held in it
    (external ones read through ``reader``), those named in ``weights`` replaced by those arrays."""
    header = copy_fields(model, onnx.ModelProto(), skip="graph")
    graph = header.graph
    graph.name = f"{model.graph.name}_nodes_{segment.start}_{segment.stop}"
    graph.node.extend(model.graph.node[segment.start : segment.stop])
    read = set().union(*(_reads(node) for node in graph.node))
    declared = {value.name: value for value in (*model.graph.input, *model.graph.value_info)}
    for name in segment.inputs:
        known = declared.get(name)
        typed = helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtypes[name]), None)
        graph.input.append(known if known is not None else typed)
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    graph.value_info.extend(v for v in model.graph.value_info if v.name in read and v.name not in segment.inputs)
    for tensor in model.graph.initializer:
        if tensor.name not in read:
            continue
        if weights is not None and tensor.name in weights:
            graph.initializer.append(numpy_helper.from_array(weights[tensor.name], tensor.name))
        elif is_external(tensor):
            graph.initializer.append(numpy_helper.from_array(reader.read(tensor), tensor.name))
        else:
            graph.initializer.append(tensor)
    return header


def stored_form(layer: WeightLayer, computed: np.ndarray) -> np.ndarray:
    """A (K, N) weight as ``layer``'s initializer stores it: (K, N) float32, or (N, K) for a Gemm with transB."""
    weight = np.asarray(computed, dtype=np.float32)
    return np.ascontiguousarray(weight.T) if layer.transposed else weight


def _grams(
    model: onnx.ModelProto,
    segment: Segment,
    store: list[dict[str, np.ndarray]],
    reader: TensorReader,
    device: str,
    monitor: Monitor,
    stage: str,
) -> dict[str, GramSum]:
    """Step 1: the XᵀX of each layer input of ``segment`` over the batches of ``store``."""
    width = {layer.activation: layer.shape[0] for layer in segment.layers}
    sums = {name: GramSum(k) for name, k in width.items()}
    made = [name for name in sums if name not in segment.inputs]  # the others are fed, so already at hand
    for batch, values in zip(store, _outputs(model, segment, store, reader, device, made), strict=True):
        monitor.check(stage)
        for name, total in sums.items():
            total.add(values[name] if name in values else batch[name])
    return sums


def _outputs(
    model: onnx.ModelProto,
    segment: Segment,
    store: list[dict[str, np.ndarray]],
    reader: TensorReader,
    device: str,
    outputs: list[str],
    weights: Mapping[str, np.ndarray] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """``outputs`` of the segment (its weights as ``segment_model`` takes them) for each batch of
    ``store`` in turn; nothing is run when there are none."""
    if not outputs:
        yield from ({} for _ in store)
        return
    dtypes = {name: store[0][name].dtype for name in segment.inputs}
    with open_session(segment_model(model, segment, reader, dtypes, outputs, weights), device=device) as session:
        for batch in store:
            yield dict(zip(outputs, session.run(outputs, {n: batch[n] for n in segment.inputs}), strict=True))


def _advance(
    model: onnx.ModelProto,
    segment: Segment,
    store: list[dict[str, np.ndarray]],
    reader: TensorReader,
    device: str,
    weights: Mapping[str, np.ndarray],
    keep: set[str],
) -> None:
    """Step 3: each batch of ``store`` given the segment's outputs, computed with ``weights``, and
    cleared of the activations not in ``keep`` (graph inputs are always kept)."""
    outputs = list(segment.outputs)
    for batch, values in zip(store, _outputs(model, segment, store, reader, device, outputs, weights), strict=True):
        batch.update(values)
        for name in [n for n in batch if n not in keep]:
            del batch[name]


def layer_by_layer(quantize: Callable[[WeightLayer, Gram], QuantizedLayer]) -> SegmentQuantizer[QuantizedLayer]:
    """A ``SegmentQuantizer`` quantizing each layer alone with its input's Gram (GPTQ), freeing each Gram
    after the last layer that reads it; a layer computes with what its codes dequantize to."""

    def each(segment: Segment, sums: dict[str, GramSum]) -> Iterator[tuple[QuantizedLayer, WeightLayer, np.ndarray]]:
        left = Counter(layer.activation for layer in segment.layers)  # layers still to take each Gram
        for layer in segment.layers:
            entry = quantize(layer, sums[layer.activation].gram())
            left[layer.activation] -= 1
            if not left[layer.activation]:
                del sums[layer.activation]
            yield entry, layer, entry.weight.dequantize()

    return each


def run(
    model: onnx.ModelProto,
    segments: list[Segment],
    batches: Batches,
    reader: TensorReader,
    device: str,
    monitor: Monitor,
    quantize: SegmentQuantizer[T],
    stage: str = STAGE,
) -> Iterator[T]:
    """What ``quantize`` yields for each layer of ``segments``, segment after segment (module docstring),
    as the caller takes them; progress and cancel checks under ``stage``."""
    graph_inputs = {value.name for value in model.graph.input}
    store = [dict(batch) for batch in batches]  # per batch: graph inputs and the activations at the cut
    total, done = sum(len(s.layers) for s in segments), 0
    for index, segment in enumerate(segments):
        monitor.check(stage)
        sums = _grams(model, segment, store, reader, device, monitor, stage)
        weights = {}
        for result, layer, computed in quantize(segment, sums):
            done += 1
            monitor.report(stage, done / (total + 1), f"segment {index + 1}/{len(segments)}: layer {done}/{total}")
            if index + 1 < len(segments):
                weights[layer.weight_name] = stored_form(layer, computed)
            yield result
            monitor.check(stage)
        sums.clear()  # before the next segment's Grams are summed
        if index + 1 < len(segments):
            later = set().union(*(s.inputs for s in segments[index + 1 :]))
            _advance(model, segment, store, reader, device, weights, later | graph_inputs)
