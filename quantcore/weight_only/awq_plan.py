"""AWQ over the model one segment at a time (``quantcore.weight_only.segments``), as GPTQ runs: each
group's s is searched (``quantcore.weight_only.awq``) on the Gram of its input in the model whose earlier
segments are already quantized, and only one segment's Grams are held. The calibrate stage makes the
plan, ``AwqPlan``: every group's s and every layer's ``LayerChoice`` (s, the s' folded into its output
columns, its clip ratios as indices), a group member's as its group's search chose it (its clip search is
not run again), a layer in no group's from the clip search alone. The export stage then reads each weight
once more and remakes its codes from its choice alone (``quantize_planned``), with no Gram, while the
writer takes them one at a time.

Within a segment the groups are searched downstream first, so that a layer whose output columns take a
later group's ÷ s' (``Group.absorbed`` naming a quantized layer's weight) is searched and quantized with
that s' known. Where that layer lies in an earlier segment than the group (already quantized when the
group is searched), the group's ÷ s is a Mul inserted before it instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from quantcore.graph.channel_scaling import Group, find_groups, scale_channels
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.weight_only import awq, segments
from quantcore.weight_only.awq import ChannelScale, LayerChoice
from quantcore.weight_only.blocks import BlockGrid, BlockwiseWeight, quantize_rtn
from quantcore.weight_only.gram import GramSum
from quantcore.weight_only.layers import WeightLayer
from quantcore.weight_only.tensors import TensorReader

STAGE = "calibrate"


@dataclass(frozen=True)
class LayerErrors:
    """‖XW - XŴ‖²_F / ‖XW‖²_F on the calibration data of the weight kept and of round-to-nearest (None
    when XW is 0 there), X the layer's input in the model whose earlier segments are quantized."""

    output: float | None
    rtn: float | None


@dataclass(frozen=True)
class AwqPlan:
    """``groups``: those with a quantized layer, each with its ÷ s folded as the export will fold it;
    ``scales``: group input → s; ``choices`` and ``errors``: by layer node."""

    groups: tuple[Group, ...]
    scales: dict[str, ChannelScale]
    choices: dict[str, LayerChoice]
    errors: dict[str, LayerErrors]

    def scaled_model(self, model: onnx.ModelProto, reader: TensorReader, layers: list[WeightLayer]) -> onnx.ModelProto:
        """``model`` with every group's ÷ s folded or inserted, the quantized layers' weights left as they
        are (the export replaces them with their codes, which hold s and s' already)."""
        scales = {group_input: chosen.scale for group_input, chosen in self.scales.items()}
        replaced = {layer.weight_name for layer in layers}
        return scale_channels(model, list(self.groups), scales, replaced=replaced, read=reader.read)


def _folded(groups: list[Group], layers: list[WeightLayer], plan: list[segments.Segment]) -> list[Group]:
    """The groups with a quantized layer; a group whose ÷ s would be folded into a quantized layer of an
    earlier segment than its own first layer's gets an inserted Mul instead (module docstring)."""
    segment_of = {layer.node: i for i, segment in enumerate(plan) for layer in segment.layers}
    by_weight = {layer.weight_name: layer for layer in layers}
    kept = []
    for group in groups:
        members = [segment_of[n] for n in group.layers if n in segment_of]
        if not members:
            continue
        producers = [by_weight[name].node for name, _ in group.absorbed or () if name in by_weight]
        if any(segment_of[node] != min(members) for node in producers):
            group = dataclasses.replace(group, absorbed=None)
        kept.append(group)
    return kept


def make_plan(
    model: onnx.ModelProto,
    layers: list[WeightLayer],
    batches: Batches,
    grid: BlockGrid,
    device: str,
    monitor: Monitor,
    reader: TensorReader,
) -> AwqPlan:
    """AWQ's choices for every layer of ``model`` (module docstring); ``reader``: its initializers' values."""
    cuts = segments.plan(model, layers)
    groups = _folded(find_groups(model.graph), layers, cuts)
    by_node = {layer.node: layer for layer in layers}
    by_weight = {layer.weight_name: layer for layer in layers}
    folds_into = {by_weight[name].node: g.input for g in groups for name, _ in g.absorbed or () if name in by_weight}
    scales: dict[str, ChannelScale] = {}
    choices: dict[str, LayerChoice] = {}
    errors: dict[str, LayerErrors] = {}
    searched: dict[str, tuple[LayerChoice, float]] = {}  # by node: a group member's choice and error, from its search

    def out_scale(layer: WeightLayer) -> np.ndarray | None:
        folded = folds_into.get(layer.node)
        return None if folded is None else scales[folded].scale

    def each(
        segment: segments.Segment, sums: dict[str, GramSum]
    ) -> Iterator[tuple[LayerChoice, WeightLayer, np.ndarray]]:
        nodes = {layer.node for layer in segment.layers}
        pending = [g for g in groups if g.input not in scales and nodes.intersection(g.layers)]
        for group in reversed(pending):  # downstream first: a layer's s' is its output group's s
            monitor.check(STAGE)
            members = [by_node[n] for n in group.layers if n in by_node]
            weights = [(m.read(), out_scale(m)) for m in members]
            scales[group.input], chosen = awq.search(weights, sums[group.input].gram(), grid)
            searched.update(zip((m.node for m in members), chosen, strict=True))
            monitor.report(
                STAGE, len(choices) / (len(layers) + 1), f"awq: {group.input}: alpha {scales[group.input].alpha:g}"
            )
        for layer in segment.layers:
            gram, weight = sums[layer.activation].gram(), layer.read()
            if layer.node in searched:
                choice, error = searched.pop(layer.node)
                computed = awq.quantize_chosen(weight, choice, grid)[1]
            else:  # in no group: s = 1, the clip search alone
                choice, _, computed, error = awq.quantize_layer(weight, gram, None, out_scale(layer), grid)
            choices[layer.node] = choice
            signal = gram.output_error(weight)
            rtn = gram.output_error(weight - quantize_rtn(weight, grid).dequantize())
            errors[layer.node] = LayerErrors(*(e / signal if signal > 0 else None for e in (error, rtn)))
            yield choice, layer, computed

    for _ in segments.run(model, cuts, batches, reader, device, monitor, each, STAGE):
        pass
    return AwqPlan(tuple(groups), scales, choices, errors)


def quantize_planned(layer: WeightLayer, plan: AwqPlan, grid: BlockGrid) -> BlockwiseWeight:
    """``layer``'s codes as its choice in ``plan`` makes them (the same as the search's: the same steps on
    the same weight)."""
    return awq.quantize_chosen(layer.read(), plan.choices[layer.node], grid)[0]
