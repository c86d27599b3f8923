"""Layer-wise error analysis: where the quantization error comes from, tensor by tensor and layer by layer
(PPQ's graphwise and layerwise analyses, ONNX Runtime's ``qdq_loss_debug``).

The measurements switch quantization on and off per layer in two models of the exported graph
(``quantcore.analysis.switch``): every flag off is the FP32 model, every flag on the exported model run
as exact Q/DQ, one flag on is "only layer k quantized". The graph-wise run of a batch computes the
FP32 model and the exported one together and reduces every quantized activation to sums inside the
graph (``quantcore.analysis.graphwise``): it fetches scalars only. The layer-wise runs fetch the model's
outputs only, each at the cost of one FP32 inference.

For every quantized tensor t (x = its FP32 value, x̂ = its dequantized value):

- ``graphwise_sqnr_db``: SQNR of x̂ in the fully quantized model against x in the FP32 model, i.e. the
  error accumulated from the inputs up to and including t's own quantization;
- ``local_sqnr_db``: SQNR of Q/DQ(x) against x on FP32 inputs: what quantizing t alone costs at t;
- the range statistics: observed min/max of x (weights: their values; activations: over the analysed
  samples), the range the chosen clipping keeps (``range_min``/``range_max`` = (quant_min - o)·s and
  (quant_max - o)·s, FP8: ±quant_max·s; the widest channel's when per-channel) and ``clipped_fraction``,
  the fraction of x outside it; weights also ``channel_range_ratio`` = max_c amax_c / median_c amax_c
  (an outlier channel shows up as a large ratio).

For every layer k: ``sqnr_db``/``cosine`` of the model outputs with only layer k quantized against
FP32 (SQNR = 10·log10(Σx²/Σ(x - x̂)²), the worst over the float outputs). Layers are ranked by harm:
lowest layer-wise SQNR first (non-finite outputs first of all; layers without a layer-wise run last).

Cost: graphwise one run of the twin model (the switchable model twice) per batch; layer-wise (1 + L)
runs per batch over ``layerwise_samples`` samples, for L = min(layers, ``max_layers``) layers (those with
the lowest local SQNR at their inputs), each of the L on only the part of the graph downstream of its
layer (``quantcore.analysis.cones``; the report's ``layer_run_fraction``: the wall time of such a run
against the whole-model reference run, measured). Samples and layers are lowered to keep the layer-wise
runs to ``layerwise_seconds`` (priced by runs of the first sample); the report states the bounds and what they
allowed.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from quantcore.analysis.cones import Cone, LayerRuns, Price, layer_runs
from quantcore.analysis.graphwise import graphwise_rows
from quantcore.analysis.ranges import RangeStats, channel_range_ratio
from quantcore.analysis.switch import GatedModel, gated_model, switchable_model
from quantcore.annotate.annotation import Annotation
from quantcore.config import AnalysisOptions, QuantizeConfig
from quantcore.graph.index import GraphIndex
from quantcore.numerics.fake_quant import fake_quantize_numpy
from quantcore.numerics.metrics import OutputAgreement
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import EXPOSED_BYTES_PER_BATCH, Batches, InputSpec, input_specs

STAGE = "analyze"


def _first_samples(
    arrays: Mapping[str, np.ndarray], specs: list[InputSpec], count: int | None, minimum: int
) -> dict[str, np.ndarray]:
    """The first ``max(count, minimum)`` samples of every input, along its batch axis (inputs without
    one, such as a scalar rate, are passed whole); all of them when ``count`` is None."""
    if count is None:
        return dict(arrays)
    axes = {spec.name: spec.batch_axis for spec in specs}
    window = slice(max(count, minimum))
    return {
        name: array if axes.get(name, 0) is None else array[(slice(None),) * axes.get(name, 0) + (window,)]
        for name, array in arrays.items()
    }


def analyze(
    prepared: PreparedModel,
    annotation: Annotation,
    evaluation: Mapping[str, np.ndarray],
    config: QuantizeConfig,
    *,
    options: AnalysisOptions | None = None,
    monitor: Monitor | None = None,
    cones: bool = True,
) -> dict[str, Any]:
    """Per-tensor and per-layer error of the calibrated ``annotation`` on ``evaluation`` (``{input:
    array}``, samples along each input's batch axis); a JSON-ready dict (see module). ``cones``: whether
    the layer-wise runs may use cones (``quantcore.runtime.memory_plan``). Raises ``Canceled`` between
    batches."""
    options = options or config.analysis
    monitor = monitor or Monitor()
    switchable = switchable_model(prepared, annotation)
    specs = input_specs(prepared.model)
    fixed = max((s.fixed_batch or 1 for s in specs), default=1)

    def batches(count: int | None) -> Batches:
        return Batches(_first_samples(evaluation, specs, count, fixed), specs, config.batch_size, what="evaluation")

    graphwise_batches, layerwise_batches = batches(options.graphwise_samples), batches(options.layerwise_samples)
    progress = _Progress(monitor, len(graphwise_batches) + len(layerwise_batches))
    tensors = graphwise_rows(
        switchable, annotation, graphwise_batches, config.device, check=progress.check, step=progress.step
    )
    layers = switchable.layers
    del switchable  # its graph, as big as the model, before the gated one is built
    tensors += _weight_rows(prepared, annotation)
    local_of = {row["tensor"]: row["local_sqnr_db"] for row in tensors}
    local_of_layer = [min_or_none([local_of.get(t) for t in layer.tensors]) for layer in layers]
    # the layers whose own quantization loses most at their inputs get the layer-wise runs
    order = sorted(range(len(layers)), key=lambda k: _harm_key(local_of_layer[k], nonfinite=False))
    wanted, wanted_samples = min(len(layers), options.max_layers), layerwise_batches.num_samples
    gated = gated_model(prepared, annotation)
    budgeted = options.layerwise_seconds is not None and wanted > 0  # without it, only the fetched bytes are used
    # the runs are typed and priced on ``probe``'s batch (``unit``: its samples)
    (stack, runs, price), unit = layerwise_batches.probe(
        functools.partial(
            _priced_runs, gated=gated, layers=order[:wanted], device=config.device, cones=cones, budgeted=budgeted
        )
    )
    with stack:
        if budgeted:
            samples, wanted = affordable(
                options.layerwise_seconds,
                price.reference_seconds * max(len(runs.cones), 1),
                [price.of_layer(k) for k in order[:wanted]],
                unit,
                wanted_samples,
            )
            layerwise_batches = batches(samples)
        # a reference run also fetches its group's cut: a batch holds at most the exposed-bytes budget
        layerwise_batches = layerwise_batches.within(price.fetched_bytes // unit, EXPOSED_BYTES_PER_BATCH)
        chosen = sorted(order[:wanted])
        plan = runs.plan(chosen)
        progress.total = progress.done + len(plan) * len(layerwise_batches)
        harm, fraction = _layerwise(runs, plan, layerwise_batches, progress)
    del gated
    rows = []
    for k, layer in enumerate(layers):
        results = [a.result() for a in harm[k].values() if a.elements] if k in harm else []
        nonfinite = any(r["nonfinite"] for r in results)
        rows.append(
            {
                "node": layer.node,
                "op_type": layer.op_type,
                "tensors": list(layer.tensors),
                "sqnr_db": None if nonfinite else min_or_none([r["sqnr_db"] for r in results]),
                "cosine": None if nonfinite else min_or_none([r["cosine"] for r in results]),
                "nonfinite": nonfinite,
                "analyzed": k in harm,
                "local_sqnr_db": local_of_layer[k],
            }
        )
    rows.sort(key=lambda r: _harm_key(r["sqnr_db"], r["nonfinite"], analyzed=r["analyzed"], exact=_exact(r)))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    total, measured, samples = len(layers), len(chosen), layerwise_batches.num_samples
    held = samples < wanted_samples or measured < min(total, options.max_layers)
    return {
        "graphwise": {
            "samples": graphwise_batches.num_samples,
            "runs_per_batch": 1,
            "batch_size": graphwise_batches.batch_size,
        },
        "layerwise": {
            "samples": samples,
            "layers_total": total,
            "layers_analyzed": measured,
            "runs_per_batch": len(plan) + measured,
            "bounds": options.to_dict(),
            "seconds_per_run": price.reference_seconds,
            "layer_run_fraction": fraction,
            "statement": (
                f"layer-wise error measured on the first {samples} evaluation samples for {measured} of {total} layers"
                + ("" if measured == total else " (those with the lowest local SQNR at their inputs)")
                + (
                    f", held to {options.layerwise_seconds:g} s as priced on the first "
                    f"{'sample' if unit == 1 else f'{unit} samples'} ({price.reference_seconds:.3g} s a whole run)"
                    if held and options.layerwise_seconds is not None
                    else ""
                )
            ),
        },
        "layers": rows,
        "tensors": tensors,
    }


class _Progress:
    """Counts batches over both passes for the stage's progress fraction."""

    def __init__(self, monitor: Monitor, total: int) -> None:
        self.monitor, self.total, self.done = monitor, max(total, 1), 0

    def check(self) -> None:
        self.monitor.check(STAGE)

    def step(self, message: str) -> None:
        self.done += 1
        self.monitor.report(STAGE, self.done / self.total, message)


def _layerwise(
    runs: LayerRuns, plan: list[tuple[Cone | None, list[int]]], batches: Batches, progress: _Progress
) -> tuple[dict[int, dict[str, OutputAgreement]], float | None]:
    """Per planned layer k, the float outputs with only k quantized against all flags off, group by group
    (per batch one reference run, then each layer's run on its group's cone); and the wall time of a
    layer's run against a reference run's, over all of them (None without layers)."""
    harm = {k: {name: OutputAgreement() for name in runs.outputs} for _, layers in plan for k in layers}
    seconds = {"reference": 0.0, "layers": 0.0}
    references = runs_of_layers = 0
    for g, (cone, layers) in enumerate(plan):
        with runs.group(cone) as group:
            for i, batch in enumerate(batches):
                progress.check()
                started = time.perf_counter()
                reference = group.reference(batch)
                seconds["reference"] += time.perf_counter() - started
                references += 1
                for k in layers:
                    started = time.perf_counter()
                    quantized = group.quantized(k, batch, reference)
                    seconds["layers"] += time.perf_counter() - started
                    runs_of_layers += 1
                    for name, y in zip(runs.outputs, quantized, strict=True):
                        harm[k][name].update(reference[name], y)
                progress.step(f"layer-wise batch {i + 1}/{len(batches)} of layer group {g + 1}/{len(plan)}")
    if not runs_of_layers or seconds["reference"] <= 0:
        return harm, None
    return harm, (seconds["layers"] / runs_of_layers) / (seconds["reference"] / references)


def _priced_runs(
    probe: Mapping[str, np.ndarray], *, gated: GatedModel, layers: list[int], device: str, cones: bool, budgeted: bool
) -> tuple[contextlib.ExitStack, LayerRuns, Price]:
    """``layer_runs`` typed on ``probe`` (open in the returned stack, which the caller closes) and their
    ``price`` on it (timed only when ``budgeted``)."""
    stack = contextlib.ExitStack()
    try:
        runs = stack.enter_context(layer_runs(gated, layers, probe, device=device, cones=cones))
        return stack, runs, runs.price(probe, cones=budgeted)
    except BaseException:
        stack.close()
        raise


def affordable(
    seconds: float, reference_seconds: float, layer_seconds: list[float], unit: int, samples: int
) -> tuple[int, int]:
    """(samples, layers) of layer-wise runs that fit ``seconds`` when, on ``unit`` samples, the reference
    runs take ``reference_seconds`` and the run of each layer (most harmful first) ``layer_seconds``: every
    layer on fewer samples (whole units, at least one); where one unit over every layer does not fit, the
    first layers that do on one unit (one at least)."""
    units = int(seconds // (reference_seconds + sum(layer_seconds)))
    if units >= 1:
        return min(samples, units * unit), len(layer_seconds)
    spent, layers = reference_seconds, 0
    for cost in layer_seconds:
        if layers and spent + cost > seconds:
            break
        spent, layers = spent + cost, layers + 1
    return min(samples, unit), layers


def min_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _exact(row: dict[str, Any]) -> bool:
    """A layer whose quantization changed no output at all (SQNR undefined because the error is 0)."""
    return row["analyzed"] and row["sqnr_db"] is None and not row["nonfinite"] and row["cosine"] is not None


def _harm_key(sqnr: float | None, nonfinite: bool, *, analyzed: bool = True, exact: bool = False) -> tuple[int, float]:
    """Sort key, most harmful first: non-finite outputs, then ascending SQNR, then error-free layers,
    then layers without a measurement."""
    if nonfinite:
        return (0, 0.0)
    if sqnr is not None:
        return (1, sqnr)
    return (2, 0.0) if exact or analyzed else (3, 0.0)


def _weight_rows(prepared: PreparedModel, annotation: Annotation) -> list[dict[str, Any]]:
    """Rows of the quantized weights, from their values (a weight's graph-wise SQNR is its local one: its
    value does not depend on the layers before it)."""
    index = GraphIndex(prepared.model.graph)
    rows = []
    for name in sorted(annotation.parameters):
        tqc = annotation.configs[name]
        weight = index.array(name).astype(np.float32)
        range_stats = RangeStats(tqc)
        range_stats.update(weight)
        agreement = OutputAgreement(argmax=False)
        agreement.update(weight.reshape(1, -1), fake_quantize_numpy(weight, tqc).reshape(1, -1))
        sqnr = agreement.result()["sqnr_db"]
        rows.append(
            {
                "tensor": name,
                "kind": "weight",
                "graphwise_sqnr_db": sqnr,
                "local_sqnr_db": sqnr,
                **range_stats.result(),
                "channel_range_ratio": channel_range_ratio(weight, tqc),
            }
        )
    return rows
