"""The layer-wise runs of the analysis (``quantcore.analysis.ranking``), each on the part of the graph its
layer reaches.

With only layer k quantized, only the nodes downstream of k (its *cone*) compute anything the all-float
run did not. The layers are split in graph order into groups of about as many layers; a group's cone
model holds the nodes downstream of any of its layers, the flag Gathers they read and the initializers
they use, and reads as graph inputs the tensors it needs from outside (its *cut*). The groups run one
after the other, each with its cone's session open: per batch, the gated model
(``quantcore.analysis.switch``) runs once with every flag off (the *reference*: the model's outputs and
the group's cut), then each of the group's layers runs its cone. An output a cone does not reach is the
reference's. ONNX Runtime runs the same kernels on the same values, so the figures are those of
whole-model runs.

Cost per batch, L layers in G groups: G reference runs and L cone runs; where the cost is spread evenly
along a chain, about G + L(G + 1)/2G whole runs, least at G = sqrt(L/2). ``groups_for`` takes that, at
most ``GROUPS``, and no cones below two groups. Measured (``bench.analysis``, 16 samples, 256 layers in 8
groups): the analyze stage 51.2 → 41.1 s on a PaddleOCR detector and 135.4 → 98.9 s on its recognizer,
a layer's run 0.55 and 0.49 of a reference run, the same figures to the bit. Memory: the reference and
one cone session are open at a time, which cost those two models 369 and 427 MB more at the peak (with
every cone's session open at once it was 1 GB more); a model over ``CONE_MODEL_BYTES`` gets no cones (a
cone's session holds a second copy of up to all of its weights), nor does one whose cut holds a value
that is not a tensor (a sequence).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from quantcore.analysis.switch import MASK_INPUT, GatedModel
from quantcore.graph.index import GraphIndex, subgraph_references
from quantcore.graph.protobuf import serialised_size
from quantcore.runtime.session import open_session

GROUPS = 8
CONE_MODEL_BYTES = 1 << 30


@dataclass(frozen=True)
class Cone:
    """The nodes to rerun for ``layers`` (flag Gathers first, then graph order), the tensors they read
    from the reference run, and the model outputs they recompute."""

    layers: frozenset[int]
    nodes: tuple[onnx.NodeProto, ...]
    cut: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Price:
    """Wall seconds, on one sample (the faster of two runs), of a reference run fetching every cone's cut
    and of each coned layer's run; and the bytes that reference run fetched."""

    reference_seconds: float
    cone_seconds: Mapping[int, float]
    fetched_bytes: int

    def of_layer(self, k: int) -> float:
        """A run of layer ``k``: its cone's, or a whole run where it has none."""
        return self.cone_seconds.get(k, self.reference_seconds)


def _fastest(run: Callable[[], object]) -> float:
    times = []
    for _ in range(2):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def groups_for(layers: int) -> int:
    """How many groups ``layers`` layers are split into (see module); 1: no cones."""
    return max(1, min(GROUPS, math.isqrt(layers // 2)))


class GroupRuns:
    """The runs of one group: the reference, and its layers' runs on its cone (None: on the whole model)."""

    def __init__(
        self,
        reference: ort.InferenceSession,
        outputs: Sequence[str],
        cone: Cone | None,
        session: ort.InferenceSession | None,
        inputs: set[str],
        num_layers: int,
    ) -> None:
        self.outputs = list(outputs)
        self._reference, self._cone, self._session = reference, cone, session
        cut = [] if cone is None else [name for name in cone.cut if name not in inputs and name not in outputs]
        self._fetched = [*outputs, *cut]
        self._all_off = np.zeros(num_layers, bool)

    def reference(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Every flag off: the model's outputs and the cone's cut (graph inputs: the batch's)."""
        values = self._reference.run(self._fetched, {**batch, MASK_INPUT: self._all_off})
        return {**batch, **dict(zip(self._fetched, values, strict=True))}

    def quantized(self, k: int, batch: Mapping[str, np.ndarray], reference: Mapping[str, Any]) -> list[Any]:
        """The model's outputs with only layer ``k`` quantized, on ``batch`` whose ``reference`` is given."""
        mask = self._all_off.copy()
        mask[k] = True
        if self._cone is None:
            return self._reference.run(self.outputs, {**batch, MASK_INPUT: mask})
        if self._session is None:
            return [reference[name] for name in self.outputs]  # a cone reaching no output changes none
        feeds = {**{name: reference[name] for name in self._cone.cut}, MASK_INPUT: mask}
        rerun = dict(zip(self._cone.outputs, self._session.run(list(self._cone.outputs), feeds), strict=True))
        return [rerun.get(name, reference[name]) for name in self.outputs]


class LayerRuns:
    """The reference session and the cones of the planned layers (see module)."""

    def __init__(
        self,
        gated: GatedModel,
        reference: ort.InferenceSession,
        cones: Sequence[Cone],
        values: Mapping[str, np.ndarray],
        inputs: Mapping[str, np.ndarray],
        device: str,
    ) -> None:
        self.outputs = list(gated.outputs)
        self.cones = list(cones)
        self._gated, self._reference, self._values, self._device = gated, reference, values, device
        self._inputs = set(inputs)

    def plan(self, layers: Sequence[int]) -> list[tuple[Cone | None, list[int]]]:
        """``layers`` by group, in graph order: (cone, its layers among them) for the cones holding any,
        or a single (None, all of them) without cones."""
        if not self.cones:
            return [(None, sorted(layers))] if layers else []
        wanted = set(layers)
        groups = [(cone, sorted(wanted & cone.layers)) for cone in self.cones]
        return [(cone, chosen) for cone, chosen in groups if chosen]

    def price(self, sample: Mapping[str, np.ndarray], *, cones: bool = True) -> Price:
        """What the runs cost on ``sample`` (see ``Price``): each cone's session is opened for it, unless
        ``cones`` is False (no cone priced: ``of_layer`` then gives the reference run's seconds)."""
        fetched = [*self.outputs, *(name for name in self._values if name not in self.outputs)]
        feeds = {**sample, MASK_INPUT: np.zeros(len(self._gated.layers), bool)}
        values = self._reference.run(fetched, feeds)
        fetched_bytes = sum(value.nbytes for value in values if isinstance(value, np.ndarray))
        reference_seconds = _fastest(lambda: self._reference.run(fetched, feeds))
        cone_seconds: dict[int, float] = {}
        for cone in self.cones if cones else []:
            with self.group(cone) as group:
                reference = group.reference(sample)
                first = min(cone.layers)
                seconds = _fastest(
                    lambda group=group, k=first, reference=reference: group.quantized(k, sample, reference)
                )
            cone_seconds.update(dict.fromkeys(cone.layers, seconds))
        return Price(reference_seconds, cone_seconds, fetched_bytes)

    @contextlib.contextmanager
    def group(self, cone: Cone | None) -> Iterator[GroupRuns]:
        """The runs of ``cone``'s group, its session open while they last."""
        num_layers = len(self._gated.layers)
        if cone is None or not cone.outputs:
            yield GroupRuns(self._reference, self.outputs, cone, None, self._inputs, num_layers)
            return
        model = _cone_model(self._gated.model, cone, self._values)
        with open_session(model, device=self._device, exact_qdq=True) as session:
            del model
            yield GroupRuns(self._reference, self.outputs, cone, session, self._inputs, num_layers)


@contextlib.contextmanager
def layer_runs(
    gated: GatedModel, layers: Sequence[int], sample: Mapping[str, np.ndarray], *, device: str, cones: bool = True
) -> Iterator[LayerRuns]:
    """The layer-wise runs of at most ``layers`` (flag indices) of ``gated``, in ``groups_for`` groups;
    ``sample`` (a batch of the run's inputs) types the cuts. No cones over ``CONE_MODEL_BYTES``, nor
    without ``cones``."""
    use_cones = cones and serialised_size(gated.model) <= CONE_MODEL_BYTES
    groups = groups_for(len(layers)) if use_cones else 1
    cones = _cones(gated, sorted(layers), groups) if groups >= 2 else []
    cut = sorted({name for cone in cones for name in cone.cut} - set(sample))  # model outputs among them too
    extra = [name for name in cut if name not in set(gated.outputs)]
    with open_session(gated.model, device=device, exact_qdq=True, outputs=extra) as reference:
        every_flag_off = {**sample, MASK_INPUT: np.zeros(len(gated.layers), bool)}
        values = dict(zip(cut, reference.run(cut, every_flag_off), strict=True)) if cut else {}
        if not all(isinstance(value, np.ndarray) for value in values.values()):
            cones, values = [], {}  # a sequence in the cut: whole-model runs
        yield LayerRuns(gated, reference, cones, values, sample, device)


def _reads(node: onnx.NodeProto) -> set[str]:
    return {name for name in node.input if name} | subgraph_references(node)


def _cones(gated: GatedModel, layers: list[int], groups: int) -> list[Cone]:
    """The cones of ``layers`` split in graph order into ``groups`` groups of about as many layers."""
    graph = gated.model.graph
    index = GraphIndex(graph)
    flags = set(gated.flags)
    outside = set(index.graph_inputs) | set(index.producers)
    cones = []
    for group in np.array_split(np.array(layers, dtype=np.int64), groups):
        roots = {id(node) for k in group for node, _ in index.consumers[gated.flags[k]]}
        live: list[onnx.NodeProto] = []
        produced: set[str] = set()
        for node in graph.node:
            if id(node) in roots or not _reads(node).isdisjoint(produced):
                live.append(node)
                produced.update(name for name in node.output if name)
        gathers: list[onnx.NodeProto] = []
        cut: list[str] = []
        seen = set(produced) | {MASK_INPUT}
        for node in live:
            for name in [*(i for i in node.input if i), *sorted(subgraph_references(node))]:
                if name in seen or index.is_initializer(name) or name not in outside:
                    continue  # names made inside a subgraph are neither produced nor graph inputs
                seen.add(name)
                if name in flags:
                    gathers.append(index.producers[name])
                else:
                    cut.append(name)
        outputs = tuple(name for name in gated.outputs if name in produced)
        cones.append(Cone(frozenset(int(k) for k in group), (*gathers, *live), tuple(cut), outputs))
    return cones


def _cone_model(model: onnx.ModelProto, cone: Cone, values: Mapping[str, Any]) -> onnx.ModelProto:
    """The gated ``model`` cut down to ``cone``: its cut as graph inputs, typed as the graph's own inputs
    or by their reference ``values``, and the outputs it recomputes."""
    graph = model.graph
    declared = {value.name: value for value in graph.input}
    inputs = [declared[MASK_INPUT]]
    for name in cone.cut:
        if name in declared:
            inputs.append(declared[name])
        else:
            elem_type = helper.np_dtype_to_tensor_dtype(values[name].dtype)
            inputs.append(helper.make_tensor_value_info(name, elem_type, None))
    used = set().union(*(_reads(node) for node in cone.nodes))
    outputs = [value for value in graph.output if value.name in set(cone.outputs)]
    initializers = [tensor for tensor in graph.initializer if tensor.name in used]
    cut_graph = helper.make_graph(list(cone.nodes), graph.name, inputs, outputs, initializer=initializers)
    cut_model = helper.make_model(cut_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    cut_model.functions.extend(model.functions)
    return cut_model
