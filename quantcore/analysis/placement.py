"""Latency-aware placement on the onnxruntime platform: quantized regions that do not pay for their
Q/DQ conversions on this CPU go back to float (``QuantizeConfig.cpu_objective == "latency"``).

After export, the calibrated annotation is split into regions (``quantcore.analysis.regions``). A round
profiles the current model and the FP32 model, interleaved (``quantcore.evaluate.node_profile``: a few
runs at each of ``config.cpu_batch_sizes`` with ``config.cpu_threads``, every node's kernel time), and
estimates each region's cost from the two (``quantcore.analysis.region_costs``:
its quantized kernels and conversions against its float nodes). The regions estimated slower quantized go
float together, and the next round profiles the model that leaves (the neighbours of a region gone float
are annotated afresh), until a round moves none or ``MAX_ROUNDS`` rounds. A round moves regions only when
together they are estimated to save at least ``MIN_GAIN`` of FP32's time at one batch size: a smaller gain
is within what the whole runs can tell apart, and checking it costs a round. A variant timed or profiled is
annotated again with its float nodes excluded; the first calibration's scales are reused where exact
(``quantcore.calibrate.reuse``) and the other tensors observed on the first calibration batch (a kernel's
speed does not depend on its scales).

A region the profiles cannot be traced to (no node of one of them found for it) is measured as a
whole-model pair instead: the current model against the same model with the region float
(``quantcore.evaluate.paired_latency``: interleaved runs, quartiles), float when clearly faster (beyond
the spread, at one batch size and slower at none). A region ONNX Runtime refuses to run quantized (the
session fails with it, runs without it) goes float with ONNX Runtime's message.

Budget. The measurements' timed runs (their durations, cached or not, so that a rerun from the cache stops
where the first run stopped) may take ``config.cpu_timing_share`` x the job's calibration seconds (a resumed
job's: its checkpoint's), however few: the runs of a model calibrated in 20 ms are that short too. Sessions,
warm-up runs and the profiler's files come on top of the runs (10-35 % more where the runs take half a second
or more; about 50 ms a profile on the smallest models). The first round's profile is always made, at least
``node_profile.MIN_RUNS`` rounds per batch size: nothing can be said of the CPU without it.
Every later measurement (a round's profile, a fallback pair, the final comparison) is made only when its
runs fit in what is left, estimated from the first profile's run times at its protocol's minimum runs (or
its seconds per batch size, if longer). A round whose profile does not fit leaves the previous round's
model as the placed one (its moves are reported as not applied: the estimate chooses, a whole-model
measurement guarantees); a region whose pair does not fit stays quantized; a final comparison that does
not fit is replaced by the profiles' own runs (``final_source`` "profiles", below).

Last, the choice, judged first on the profiles' own runs (each profile times its models' whole runs,
interleaved): when the last round profiled the placed model and found it no slower than FP32 on a few
runs' evidence (``paired_latency.no_slower`` without its trade: clearly slower at no batch size, and its
median within ``MIN_GAIN`` of FP32's or below at every one), and no slower against FP32 than the fully
quantized model was against FP32 in the first round (the ratios of medians, within ``MIN_GAIN``: the
regions gone float paid off in whole runs too), it is kept without another measurement. A placed
model with no quantized region left is FP32's twin: the first round's profile of the fully quantized model
decides between it and FP32 when it is plain (no slower as above, or slower with no gain beyond the spread
at any batch size: ``no_slower`` with its trade); a gain beyond the spread at one batch size against a
loss within it at another goes to the timing below, whose whole runs do not carry the profiler's cost per
node (a wake-word model of 0.17 ms at batch 1 looked slower quantized in its profile, and FP32 was kept
where the quantized model ran 1.3x faster at batch 32). Otherwise FP32 (the prepared model), the fully
quantized model and the placed one are timed together before FP32 wins (the estimate chooses, a whole-model comparison
guarantees): of the two quantized ones the placed one is preferred only when clearly faster than the
fully quantized one; the preferred one is kept when it is no slower than FP32, else the other one if it
is, else FP32 (``no_slower``: as above, or clearly faster at one batch size, a gain beyond the spread
paying for a loss within it). Without the budget for that comparison, the same rule reads the profiles:
each quantized model's runs against FP32's in its own round, the placed one preferred when ``_gained``.
The objective promises a model never slower than FP32, so FP32 need not be clearly faster to win: under
load the spread of a run can swallow a 2x gap between medians. For the same reason a quantized model is kept
only on ``conclusive`` runs (``paired_latency.MIN_RUNS`` of it and of FP32 at every batch size, or
``SEPARATED_RUNS`` far apart): a profile runs a batch of 32 two to five times, four where the model it profiles
has run far faster than FP32 (``paired_latency.within_reach``: a verdict two runs more could give, cheaper than a
final comparison; where the profiler's cost weighs on a run, the unprofiled runs replacing the profiled ones go on
instead), and where fewer decide, the final comparison is timed instead, past the budget when it has
no room for it (the report's ``past_budget`` says so). FP32 may be kept on fewer runs: it is never
slower than itself. Every profile and timing
runs each batch size for ``RUN_SHARE`` x the calibration seconds, at most ``RUN_S``, and at least its
minimum of runs. The kept configuration (the float nodes added, escaped, to ``exclude_node_patterns``) is
calibrated on the full calibration data (the first calibration's scales reused where exact: only the
tensors around the float regions are observed again) and exported into ``out_dir``; the evaluate stage then measures its
accuracy as always.

Profiles and timings are read from and written to a ``TimingCache`` when the config names a directory
(``config.cpu_timing_cache``): a rerun of the same models on the same machine measures nothing.
"""

from __future__ import annotations

import functools
import glob
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from quantcore.analysis.region_costs import RegionCost, region_costs
from quantcore.analysis.regions import Region, count_op_types, quantized_regions
from quantcore.annotate.annotation import Annotation, annotate
from quantcore.calibrate.reuse import recalibrate
from quantcore.config import QuantizeConfig
from quantcore.evaluate import node_profile, paired_latency
from quantcore.evaluate.cpu_latency import fixed_batch, resolved_threads
from quantcore.evaluate.latency_cache import PROFILE, Measured, Profiles, TimingCache, timing_key
from quantcore.evaluate.node_profile import Profiler, profile_nodes
from quantcore.evaluate.paired_latency import (
    MIN_GAIN,
    Timer,
    Timing,
    compare,
    conclusive,
    interleaved_times,
    no_slower,
    signature,
    within_reach,
)
from quantcore.export.qdq import ExportResult, build_qdq_model, export
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.cpu_features import cpu_model

STAGE = "place"
LABELS = ("fp32", "quantized", "placed")  # the models the final comparison may time
MAX_ROUNDS = 3
RUN_SHARE = 0.25  # seconds of runs per batch size of each profile and timing, as a share of calibration's,
RUN_S = 0.5  # at most: by then a model's quartiles have settled, and a large one stops at its minimum of runs


@dataclass(frozen=True)
class PlacementRun:
    """What the search needs, as the pipeline holds it after export."""

    prepared: PreparedModel  # the model the annotation was made for (reconstruct's weights, if any)
    calibration: Batches
    sample: Mapping[str, np.ndarray] | None  # the first calibration batch: timing candidates calibrate on it
    base: Annotation  # the exported model's annotation, before calibration
    base_calibrated: Annotation
    base_exported: ExportResult
    out_dir: Path
    calibration_seconds: float  # the calibrate stage's: the measurements' budget (``config.cpu_timing_share``)


@dataclass(frozen=True)
class PlacementOutcome:
    config: QuantizeConfig  # with the float regions excluded
    annotation: Annotation  # as annotated, before calibration
    calibrated: Annotation
    exported: ExportResult  # base_exported when nothing changed
    report: dict[str, Any]


@dataclass(frozen=True)
class _Variant:
    """One model timed: its float nodes, config, calibrated annotation and serialized QDQ model."""

    float_nodes: tuple[str, ...]
    config: QuantizeConfig
    annotation: Annotation
    calibrated: Annotation
    model: bytes


class _Search:
    """Mutable state of one placement: the variants built, the measurements made and read from cache."""

    def __init__(
        self,
        run: PlacementRun,
        config: QuantizeConfig,
        timer: Timer | None,
        profiler: Profiler | None,
        monitor: Monitor,
    ) -> None:
        self.run, self.config, self.monitor = run, config, monitor
        self.threads = resolved_threads(config.cpu_threads)
        specs = input_specs(run.prepared.model)
        fixed = fixed_batch(specs)
        self.batch_sizes = (fixed,) if fixed is not None else tuple(config.cpu_batch_sizes)
        self.run_s = min(RUN_S, RUN_SHARE * run.calibration_seconds)
        measuring = {"specs": specs, "sample": run.sample, "threads": self.threads, "budget_s": self.run_s}
        self.timer = timer or functools.partial(interleaved_times, **measuring)
        self.profiler = profiler or functools.partial(profile_nodes, **measuring, extend=within_reach)
        self.cache = None if config.cpu_timing_cache is None else TimingCache(config.cpu_timing_cache)
        self.measured = self.cached = 0
        self.seconds = 0.0  # wall clock of the measurements made (the report's cost)
        self.budget = config.cpu_timing_share * run.calibration_seconds
        self.spent = 0.0  # seconds of timed runs of every measurement, cached or not (the budget's)
        self.run_seconds: dict[int, float] = {}  # per batch size, one run of the slower model in the first profile

    def affords(self, models: int, *, profile: bool) -> bool:
        """Whether a profile (or a timing) of ``models`` models fits in what is left of the budget: per batch size
        its protocol's minimum rounds, or ``run_s`` if longer, at the first profile's run times. True before the
        first profile, which is always made."""
        low, high = (
            (node_profile.MIN_RUNS, node_profile.RUNS) if profile else (paired_latency.MIN_RUNS, paired_latency.RUNS)
        )
        estimate = sum(
            min(high * models * seconds, max(low * models * seconds, self.run_s))
            for seconds in self.run_seconds.values()
        )
        return self.spent + estimate <= self.budget

    def variant(self, float_nodes: tuple[str, ...], *, full: bool = False) -> _Variant:
        """The model with ``float_nodes`` excluded: the first calibration's scales where they are exact, the
        tensors they do not cover observed on the full data with ``full``, else on the first batch (timing only)."""
        run = self.run
        config = replace(
            self.config, exclude_node_patterns=(*self.config.exclude_node_patterns, *map(glob.escape, float_nodes))
        )
        annotation = annotate(run.prepared, config) if float_nodes else run.base
        data = run.calibration if full or run.sample is None else run.sample
        calibrated = recalibrate(
            run.prepared,
            run.base,
            run.base_calibrated,
            annotation,
            data,
            config,
            should_cancel=self.monitor.should_cancel,
        ).annotation
        model = build_qdq_model(run.prepared, calibrated).SerializeToString()
        return _Variant(float_nodes, config, annotation, calibrated, model)

    def profile(self, models: Sequence[bytes]) -> tuple[list[Profiles], bool]:
        """Each model's node profile per batch size (or refusal); and whether they came from the cache."""
        signatures = [signature(onnx.load_from_string(m)) for m in models]
        key = timing_key([PROFILE, *signatures], self.batch_sizes, self.threads)
        get, put = (None, None) if self.cache is None else (self.cache.get_profiles, self.cache.put_profiles)
        profiles, cached = self._cached(key, get, put, lambda: self.profiler(models, self.batch_sizes))
        runs = [p for p in profiles if not isinstance(p, str)]
        self.spent += sum(p.timed_us for profile in runs for p in profile.values()) / 1e6
        if not self.run_seconds and runs:
            for batch in self.batch_sizes:
                medians = [profile[batch].run_us / 1e6 for profile in runs if batch in profile]
                self.run_seconds[batch] = max(medians, default=0.0)
        return profiles, cached

    def measure(self, models: Sequence[bytes]) -> tuple[Measured, bool]:
        """Per batch size, each model's ``Timing`` or refusal; and whether it came from the cache."""
        key = timing_key([signature(onnx.load_from_string(m)) for m in models], self.batch_sizes, self.threads)

        def run() -> Measured:
            raw = self.timer(models, self.batch_sizes)
            return {batch: [t if isinstance(t, str) else Timing.of(t) for t in times] for batch, times in raw.items()}

        get, put = (None, None) if self.cache is None else (self.cache.get, self.cache.put)
        measured, cached = self._cached(key, get, put, run)
        self.spent += _timed_seconds(measured)
        return measured, cached

    def _cached(self, key, get, put, run):
        """``get(key)`` when the cache holds it, else ``run()`` (its seconds counted) stored with ``put``;
        and whether it came from the cache."""
        if get is not None and (hit := get(key)) is not None:
            self.cached += 1
            return hit, True
        started = time.perf_counter()
        value = run()
        self.seconds += time.perf_counter() - started
        self.measured += 1
        if put is not None:
            put(key, value)
        return value, False


def _timed_seconds(measured: Measured) -> float:
    """Seconds of timed runs a measurement stands for: each timing's runs times its median."""
    return sum(t.runs * t.p50_ms / 1000.0 for models in measured.values() for t in models if isinstance(t, Timing))


def _timings(measured: Measured, index: int) -> dict[int, Timing]:
    return {b: models[index] for b, models in measured.items() if isinstance(models[index], Timing)}


def _refusal(measured: Measured, index: int) -> str | None:
    return next((m[index] for m in measured.values() if isinstance(m[index], str)), None)


def _row(
    round_index: int, region: Region, graph: onnx.GraphProto, estimate: RegionCost, cached: bool
) -> dict[str, Any]:
    return {
        "round": round_index,
        "nodes": list(region.nodes),
        "op_types": count_op_types(graph, region.nodes),
        "estimate": {
            f"batch_{b}": {"float_us": estimate.float_us[b], "quantized_us": estimate.quantized_us[b]}
            for b in estimate.float_us
        },
        "cost": estimate.cost,
        "timings": {},
        "cached": cached,
    }


def place(
    run: PlacementRun,
    config: QuantizeConfig,
    *,
    timer: Timer | None = None,
    profiler: Profiler | None = None,
    monitor: Monitor | None = None,
) -> PlacementOutcome:
    """Search and export the placement the module describes. ``timer`` / ``profiler``: measure models (a test
    passes deterministic ones; default ``paired_latency.interleaved_times`` / ``node_profile.profile_nodes``).
    Precondition: ``run.base_calibrated`` is the calibration of ``run.base`` for ``config``, exported as
    ``run.base_exported``."""
    monitor = monitor or Monitor()
    search = _Search(run, config, timer, profiler, monitor)
    graph = run.prepared.model.graph
    model = build_qdq_model(run.prepared, run.base_calibrated).SerializeToString()  # the exported model
    base = current = _Variant((), config, run.base, run.base_calibrated, model)
    fp32_model = run.prepared.model.SerializeToString()
    rows: list[dict[str, Any]] = []
    stopped, rounds = f"round limit ({MAX_ROUNDS})", 0
    profiled: list[_Profiled] = []
    moves: list[tuple[dict[str, Any], RegionCost]] = []  # the last round's regions sent float: row, estimate
    previous = current
    for round_index in range(1, MAX_ROUNDS + 1):
        rounds = round_index
        monitor.check(STAGE)
        regions = quantized_regions(graph, current.calibrated)
        if not regions:
            stopped = "no quantized region left"
            break
        if not search.affords(2, profile=True):
            rounds, current = round_index - 1, previous
            _not_applied(moves, "the timing budget has no room to profile the model without it")
            stopped = f"timing budget ({search.budget:.3g} s of runs) spent"
            break
        (fp32, quantized), cached = search.profile([fp32_model, current.model])
        profiled.append(_Profiled(current, _run_timings(fp32), _run_timings(quantized)))
        if isinstance(fp32, str) or isinstance(quantized, str):
            costs, totals = [RegionCost({}, {}, None) for _ in regions], {}
        else:
            qdq_graph = onnx.load_from_string(current.model).graph
            costs = region_costs(fp32, graph, quantized, qdq_graph, regions)
            totals = {b: sum(node.us for node in profile.nodes) for b, profile in fp32.items()}
        moves = []
        for position, (region, estimate) in enumerate(zip(regions, costs, strict=True)):
            row = _row(round_index, region, graph, estimate, cached)
            if estimate.cost is None:
                _measure_region(search, current, region, row)
            elif estimate.cost > 0:
                row.update(kept="float", reason=f"estimated slower quantized (cost {estimate.cost:+.3f})")
            else:
                row.update(kept="quantized", reason=f"estimated faster quantized (cost {estimate.cost:+.3f})")
            if row["kept"] == "float":
                moves.append((row, estimate))
            rows.append(row)
            done = min(0.9, round_index / (MAX_ROUNDS + 1))
            monitor.report(STAGE, done, f"round {round_index}, region {position + 1}/{len(regions)}: {row['kept']}")
        # moves on estimates alone (none measured or refused) must be worth a round
        if moves and all(estimate.cost is not None for _, estimate in moves):
            gain = _estimated_gain([estimate for _, estimate in moves], totals)
            if gain < MIN_GAIN:
                _not_applied(moves, f"together they save {gain:.1%} of FP32's time, under {MIN_GAIN:.0%}")
                moves = []
        if not moves:
            stopped = "no region changed the model"
            break
        float_nodes = dict.fromkeys((*current.float_nodes, *(n for row, _ in moves for n in row["nodes"])))  # ordered
        previous, current = current, search.variant(tuple(float_nodes))
    return _choose(search, base, current, profiled, rows, rounds, stopped)


def _estimated_gain(costs: Sequence[RegionCost], totals: Mapping[int, float]) -> float:
    """The share of FP32's time (its profile's node total) that ``costs``' regions together are estimated to save
    in float, at the batch size where it is largest."""
    return max(
        (sum(c.quantized_us[b] - c.float_us[b] for c in costs) / total for b, total in totals.items() if total > 0),
        default=0.0,
    )


def _not_applied(moves: Sequence[tuple[dict[str, Any], RegionCost]], why: str) -> None:
    """Report ``moves``' rows (sent float) as left quantized, and why."""
    for row, _ in moves:
        row.update(kept="quantized", reason=f"{row['reason']}; left quantized: {why}")


def _measure_region(search: _Search, current: _Variant, region: Region, row: dict[str, Any]) -> None:
    """The fallback for a region without an estimate: time ``current`` against it with ``region`` float, within
    the budget, and fill ``row``'s timings, decision and reason."""
    if not search.affords(2, profile=False):
        row.update(kept="quantized", reason=f"no estimate, and the timing budget ({search.budget:.3g} s) is spent")
        return
    trial = search.variant((*current.float_nodes, *region.nodes))
    measured, cached = search.measure([current.model, trial.model])
    row["cached"] = cached
    row["timings"] = {
        f"batch_{b}": {
            label: t.to_dict() if isinstance(t, Timing) else None
            for label, t in zip(("quantized", "float"), models, strict=True)
        }
        for b, models in measured.items()
    }
    refused, refused_float = _refusal(measured, 0), _refusal(measured, 1)
    if refused is not None and refused_float is None:
        row.update(kept="float", reason=f"ONNX Runtime refuses to run it quantized: {refused}")
    elif refused is not None or refused_float is not None:
        row.update(kept="quantized", reason=f"not measured: {refused or refused_float}")
    elif compare(_timings(measured, 1), _timings(measured, 0)) == "faster":
        row.update(kept="float", reason="no estimate; measured faster in float beyond the spread")
    else:
        row.update(kept="quantized", reason="no estimate; measured, float is not clearly faster")


@dataclass(frozen=True)
class _Profiled:
    """One round's profile as whole-model timings: FP32's and the variant's runs, interleaved (empty where
    ONNX Runtime refused one)."""

    variant: _Variant
    fp32: dict[int, Timing]
    timings: dict[int, Timing]


def _gained(placed: _Profiled, base: _Profiled) -> bool:
    """Whether the placed model ran no slower against FP32 in its round's profile than the fully quantized one
    did in its own: at every batch size, its median over FP32's within ``MIN_GAIN`` of the other's (each
    ratio is of interleaved runs, so load that differs between the two rounds cancels)."""
    batches = set(placed.timings) & set(placed.fp32) & set(base.timings) & set(base.fp32)
    return bool(batches) and all(
        placed.timings[b].p50_ms / placed.fp32[b].p50_ms
        <= base.timings[b].p50_ms / base.fp32[b].p50_ms * (1.0 + MIN_GAIN)
        for b in batches
    )


def _run_timings(profiles: Profiles) -> dict[int, Timing]:
    """Per batch size, the profiled runs' durations as a ``Timing`` (none where the profile was refused)."""
    if isinstance(profiles, str):
        return {}
    return {b: Timing.of([t / 1000.0 for t in p.run_times_us]) for b, p in profiles.items()}


def _choose(
    search: _Search,
    base: _Variant,
    placed: _Variant,
    profiled: Sequence[_Profiled],
    rows: list[dict[str, Any]],
    rounds: int,
    stopped: str,
) -> PlacementOutcome:
    """Keep the model the module's rule picks and export it (see the module for the rule, and which
    measurement it reads: the profiles' runs or the final comparison)."""
    run, config = search.run, search.config
    graph = run.prepared.model.graph
    every = tuple(n for r in quantized_regions(graph, base.calibrated) for n in r.nodes)
    all_float = bool(placed.float_nodes) and not quantized_regions(graph, placed.calibrated)
    # the model the profiles judge: placed, or all quantized where placed is FP32's twin (its first round's)
    label, candidate = ("quantized", base) if all_float or not placed.float_nodes else ("placed", placed)
    judged = next((p for p in reversed(profiled) if p.variant is candidate), None) if profiled else None
    cached = False
    # the profiles settle it when they are plain: the candidate no slower than FP32 at any batch size, or,
    # when FP32 is the alternative, slower without a gain beyond the spread anywhere; a gain at one batch
    # size against a loss within the spread at another is timed in whole runs, free of the profiler's cost
    settled = (
        judged is not None
        and bool(judged.timings)
        and (
            (no_slower(judged.timings, judged.fp32, trade=False) and conclusive(judged.timings, judged.fp32))
            or (all_float and not no_slower(judged.timings, judged.fp32))
        )
    )
    if settled and label == "placed" and not _gained(judged, profiled[0]):
        settled = False  # the regions gone float did not pay off in the whole runs: time all three together
    source, past_budget = "timed", None
    if settled:
        source, timings = "profile", {"fp32": judged.fp32, label: judged.timings}
        chosen = label if not every or no_slower(judged.timings, judged.fp32, trade=False) else "fp32"
    elif profiled and not search.affords(len(_labels(placed, all_float)), profile=False):
        chosen, timings = _from_profiles(profiled, placed, every)
        if chosen == "fp32" or conclusive(timings[chosen], timings["fp32"]):
            source = "profiles"
        else:  # the promise outranks the budget: see the module
            past_budget = _too_few(timings[chosen], timings["fp32"], chosen)
    if source == "timed":
        timings, cached = _timed(search, base, placed, all_float)
        preferred = ["quantized", "placed"] if "placed" in timings else ["quantized"]
        if "placed" in timings and compare(timings["placed"], timings["quantized"]) == "faster":
            preferred.reverse()
        fastest = (name for name in preferred if not every or no_slower(timings[name], timings["fp32"]))
        chosen = next(fastest, "fp32")
    variants = {"quantized": base, "placed": placed}
    kept = (placed if all_float else search.variant(every)) if chosen == "fp32" else variants[chosen]
    if kept is not base:
        kept = search.variant(kept.float_nodes, full=True)
    exported = (
        run.base_exported
        if kept is base
        else export(run.prepared, kept.calibrated, run.out_dir, platform=config.platform)
    )
    final = {}
    for batch in sorted(set().union(*(t.keys() for t in timings.values()))):
        entry = {name: timings[name][batch].to_dict() if batch in timings.get(name, {}) else None for name in LABELS}
        fp32_p50, kept_timing = entry["fp32"], timings.get(chosen, {}).get(batch)
        speedup = None if fp32_p50 is None or kept_timing is None else fp32_p50["p50_ms"] / kept_timing.p50_ms
        final[f"batch_{batch}"] = {**entry, "speedup_p50": speedup}
    float_moves = sum(1 for row in rows if row["kept"] == "float")
    report = {
        "objective": config.cpu_objective,
        "threads": search.threads,
        "batch_sizes": list(search.batch_sizes),
        "cpu": cpu_model(),
        "onnxruntime": ort.__version__,
        "rounds": rounds,
        "stopped": stopped,
        "regions": rows,
        "kept": chosen,
        "float_nodes": list(kept.float_nodes),
        "final": final,
        "final_source": source,
        "final_cached": cached,
        "measurements": search.measured,
        "cached_measurements": search.cached,
        "measured_seconds": round(search.seconds, 3),
        "timed_seconds": round(search.spent, 3),
        "timing_budget_s": round(search.budget, 3),
        "past_budget": past_budget,
        "statement": _statement(chosen, float_moves, len(kept.float_nodes), final),
    }
    return PlacementOutcome(kept.config, kept.annotation, kept.calibrated, exported, report)


def _too_few(candidate: Mapping[int, Timing], fp32: Mapping[int, Timing], label: str) -> str:
    """Why the final comparison was timed past the budget: the profile runs ``label``'s verdict would rest on."""
    short = (
        ", ".join(
            f"{min(candidate[b].runs, fp32[b].runs)} at batch {b}"
            for b in sorted(set(candidate) & set(fp32))
            if min(candidate[b].runs, fp32[b].runs) < paired_latency.MIN_RUNS
        )
        or "none beside FP32's"
    )
    return (
        f"the profiles' runs ({short}) are too few to promise the {label} model no slower than FP32 "
        f"({paired_latency.MIN_RUNS} a batch size, or {paired_latency.SEPARATED_RUNS} far apart); "
        "the final comparison was timed past the budget"
    )


def _labels(placed: _Variant, all_float: bool) -> tuple[str, ...]:
    """The models the final comparison times: placed only where it is neither FP32's nor all quantized's twin."""
    return ("fp32", "quantized") if all_float or not placed.float_nodes else LABELS


def _timed(
    search: _Search, base: _Variant, placed: _Variant, all_float: bool
) -> tuple[dict[str, dict[int, Timing]], bool]:
    """FP32, all quantized and (unless it is either's twin) placed, timed together: per label its timings; and
    whether they came from the cache."""
    fp32 = search.run.prepared.model.SerializeToString()
    labels = _labels(placed, all_float)
    measured, cached = search.measure([fp32, base.model, placed.model][: len(labels)])
    return {label: _timings(measured, i) for i, label in enumerate(labels)}, cached


def _from_profiles(
    profiled: Sequence[_Profiled], placed: _Variant, every: Sequence[str]
) -> tuple[str, dict[str, dict[int, Timing]]]:
    """The final comparison's rule on the profiles' runs, each quantized model against FP32 in its own round: the
    placed model first where ``_gained``, else all quantized; the first no slower than FP32, else FP32. The
    chosen label, and the timings it read (FP32's from the chosen model's round)."""
    first = profiled[0]
    last = next((p for p in reversed(profiled) if p.variant is placed and p is not first), None)
    candidates = [("quantized", first)]
    if last is not None:
        candidates.insert(0 if _gained(last, first) else 1, ("placed", last))
    for label, seen in candidates:
        if seen.timings and (not every or no_slower(seen.timings, seen.fp32)):
            return label, {"fp32": seen.fp32, label: seen.timings}
    return "fp32", {"fp32": first.fp32, "quantized": first.timings}


def _statement(chosen: str, float_moves: int, float_nodes: int, final: Mapping[str, Any]) -> str:
    speedups = ", ".join(
        f"{key.removeprefix('batch_')}: {v['speedup_p50']:.2f}x" for key, v in final.items() if v["speedup_p50"]
    )
    what = {
        "quantized": "every region stays quantized",
        "placed": f"{float_moves} region(s), {float_nodes} node(s), kept float for speed",
        "fp32": "every region kept float: no quantized model is as fast as FP32 on this CPU",
    }[chosen]
    return f"{what}; speed-up over FP32 (p50) at batch {speedups}" if speedups else what
