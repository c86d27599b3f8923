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
runs to ``layerwise_seconds`` (priced by runs of the first sample), and the runs are held to it on the clock
as well (``_Bound``): the price of one sample can miss what a batch costs, and opening a cone's session is not
priced at all. The groups run most harmful first (the group holding the layer of lowest local SQNR first,
its layers in that order too); before each cone session, reference run and layer run, the next one's
seconds are estimated from the same kind's last run (a layer's first run in its group: the reference run
just made, times its priced fraction of one), and where it would end past the bound the runs stop, keeping
what was measured: a layer's figures are over the batches it was run on. The first reference run and layer
run always run (as ``affordable`` keeps one layer at least). Neither the order nor the clock changes a figure
where the bound is not reached. The report states the bounds and what they allowed.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
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
        # most harmful first, so that what the clock leaves out is the least harmful (see module)
        priority = {k: i for i, k in enumerate(order)}
        plan = sorted(
            ((cone, sorted(group, key=priority.__getitem__)) for cone, group in runs.plan(chosen)),
            key=lambda entry: priority[entry[1][0]],
        )
        progress.total = progress.done + len(plan) * len(layerwise_batches)
        bound = _Bound(options.layerwise_seconds if budgeted else None, price)
        measured = _layerwise(runs, plan, layerwise_batches, progress, bound)
    del gated
    harm = measured.harm
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
    planned_runs = (len(plan) + len(chosen)) * len(layerwise_batches)
    planned = (layerwise_batches.num_samples, wanted_samples)
    statement = _statement(measured, len(layers), planned, planned_runs, options, price, unit)
    return {
        "graphwise": {
            "samples": graphwise_batches.num_samples,
            "runs_per_batch": 1,
            "batch_size": graphwise_batches.batch_size,
        },
        "layerwise": {
            "samples": measured.most_samples(layerwise_batches.num_samples),
            "layers_total": len(layers),
            "layers_analyzed": len(harm),
            "runs_per_batch": measured.groups + len(harm),  # a reference run per group run, one per layer
            "bounds": options.to_dict(),
            "seconds_per_run": price.reference_seconds,
            "layer_run_fraction": measured.fraction(),
            "statement": statement,
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


class _Bound:
    """The clock of the layer-wise runs against ``seconds`` from their start (None: no bound): whether a run
    estimated at some seconds still ends within it. Once one would not, none does (``stopped``)."""

    def __init__(self, seconds: float | None, price: Price) -> None:
        self.price, self.stopped = price, False
        self.deadline = None if seconds is None else time.perf_counter() + seconds

    def fits(self, estimate: float) -> bool:
        if self.deadline is not None and not self.stopped:
            self.stopped = time.perf_counter() + estimate > self.deadline
        return not self.stopped

    def layer_share(self, k: int) -> float:
        """Layer ``k``'s run as priced, against the reference run's (1 where the price knows neither)."""
        reference = self.price.reference_seconds
        return self.price.of_layer(k) / reference if reference > 0 else 1.0


@dataclass
class _Measured:
    """What the layer-wise runs measured: per layer run at least once, its output agreements and the samples
    they cover; the groups run, and the runs and wall seconds of each kind."""

    harm: dict[int, dict[str, OutputAgreement]] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)
    groups: int = 0
    references: int = 0
    layer_runs: int = 0
    reference_seconds: float = 0.0
    layer_seconds: float = 0.0
    stopped: bool = False

    def most_samples(self, planned: int) -> int:
        """The samples of the layers measured on most of them (``planned`` where none was measured)."""
        return max(self.samples.values(), default=planned)

    def fraction(self) -> float | None:
        """The wall time of a layer's run against a reference run's, over all of them (None without layers)."""
        if not self.layer_runs or self.reference_seconds <= 0:
            return None
        return (self.layer_seconds / self.layer_runs) / (self.reference_seconds / self.references)


def _layerwise(
    runs: LayerRuns, plan: list[tuple[Cone | None, list[int]]], batches: Batches, progress: _Progress, bound: _Bound
) -> _Measured:
    """Per planned layer k, the float outputs with only k quantized against all flags off, group by group
    (per batch one reference run, then each layer's run on its group's cone), within ``bound`` (see
    module)."""
    measured = _Measured()
    sizes = [
        min(batches.batch_size, batches.num_samples - start)
        for start in range(0, batches.num_samples, batches.batch_size)
    ]
    opening = 0.0  # wall seconds to open the last group's cone session
    reference_pace = 0.0  # wall seconds a sample of the last reference run
    for g, (cone, layers) in enumerate(plan):
        # a batch is worth starting only with its reference run and one layer's run
        first = 1 + bound.layer_share(layers[0])
        if measured.references and not bound.fits(opening + reference_pace * sizes[0] * first):
            break
        started, runs_before = time.perf_counter(), measured.layer_runs
        with runs.group(cone) as group:
            opening = time.perf_counter() - started
            layer_pace: float | None = None  # wall seconds a sample of this group's last layer run
            for i, (batch, size) in enumerate(zip(batches, sizes, strict=True)):
                progress.check()
                if i and not bound.fits(reference_pace * size * first):
                    break
                started = time.perf_counter()
                reference = group.reference(batch)
                seconds = time.perf_counter() - started
                measured.reference_seconds += seconds
                measured.references += 1
                reference_pace = seconds / size
                for k in layers:
                    estimate = seconds * bound.layer_share(k) if layer_pace is None else layer_pace * size
                    if measured.layer_runs and not bound.fits(estimate):
                        break
                    started = time.perf_counter()
                    quantized = group.quantized(k, batch, reference)
                    elapsed = time.perf_counter() - started
                    measured.layer_seconds += elapsed
                    measured.layer_runs += 1
                    layer_pace = elapsed / size
                    agreements = measured.harm.setdefault(k, {name: OutputAgreement() for name in runs.outputs})
                    for name, y in zip(runs.outputs, quantized, strict=True):
                        agreements[name].update(reference[name], y)
                    measured.samples[k] = measured.samples.get(k, 0) + size
                progress.step(f"layer-wise batch {i + 1}/{len(batches)} of layer group {g + 1}/{len(plan)}")
                if bound.stopped:
                    break
        measured.groups += measured.layer_runs > runs_before
        if bound.stopped:
            break
    measured.stopped = bound.stopped
    return measured


def _statement(
    measured: _Measured,
    total: int,
    planned: tuple[int, int],
    planned_runs: int,
    options: AnalysisOptions,
    price: Price,
    unit: int,
) -> str:
    """The report's account of the layer-wise runs: on how many samples how many of the ``total`` layers were
    measured, and what held them where the bounds did. ``planned``: the samples the runs were given and those
    the options asked for; ``planned_runs``: the runs on them."""
    samples = measured.most_samples(planned[0])
    counts = sorted(measured.samples.values())
    full = counts.count(samples)
    fewer = [count for count in counts if count < samples]
    analyzed = len(counts)
    text = f"layer-wise error measured on the first {samples} evaluation samples for {full} of {total} layers"
    if fewer:
        span = f"{fewer[0]}" if fewer[0] == fewer[-1] else f"{fewer[0]} to {fewer[-1]}"
        text += f" and on the first {span} for {len(fewer)} more"
    if analyzed < total:
        text += " (those with the lowest local SQNR at their inputs" + (" first)" if measured.stopped else ")")
    held = measured.stopped or samples < planned[1] or analyzed < min(total, options.max_layers)
    if held and options.layerwise_seconds is not None:
        text += (
            f", held to {options.layerwise_seconds:g} s as priced on the first "
            f"{'sample' if unit == 1 else f'{unit} samples'} ({price.reference_seconds:.3g} s a whole run)"
        )
        if measured.stopped:
            runs = measured.references + measured.layer_runs
            text += f" and on the clock: stopped after {runs} of {planned_runs} runs"
    return text


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
