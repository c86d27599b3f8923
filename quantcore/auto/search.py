"""The auto search: run each candidate config (``quantcore.auto.candidates``) on the selection split, keep
the best by the objective, and, when none meets it, keep the most harmful layers of the best in float.

Each candidate is one ``quantize`` run, calibrated on the calibration part of the split and evaluated on
the selection part (``quantcore.auto.selection``), with the analysis, the CPU latency stage and the engine
off (the search needs only the metric), in its own directory under the search's temporary one. Its score
is the objective (``AccuracyTarget``) measured as the accuracy target measures it
(``quantcore.analysis.accuracy_target.measure``: the worst float output, on the exported model as deployed
on ONNX Runtime, exact Q/DQ where the deployed session could not be built), and kept per sample
(``quantcore.auto.scoring``): a later candidate is chosen over an earlier one only when it is better
beyond the paired bootstrap interval on the selection split.

Budget: ``budget_seconds`` bounds the search and the final run together. A candidate's final run is estimated
from its own stage seconds (``final_seconds``, ``quantcore.auto.budget``: the stages grown by the final run's
samples, plus the analysis and the latency stage the candidates skip), and that of the candidate chosen so far
is held back. Every candidate, the first (the config as given) included, is stopped at its next batch once the
time left no longer holds the larger of the final run held back and its own final run at the seconds it will
have taken by the projected end of its current stage (``Deadline``: its own final run estimated from the
stages it has run, that one to its projected end; recorded as stopped). The first's analysis probe is the
exception: it comes after the candidate's evaluate stage, so a probe that no longer fits stops alone
(``ProbeStopped``, which the pipeline's analyze stage records as an analysis that failed, going on without
it), the candidate is scored, and the final run runs without the analysis (``quantcore.auto.budget``); where a
target needs the analysis's ranking the analysis is no probe and the whole candidate stops. When the first is
stopped, nothing is scored: the final run is the config as given, without the analysis, and the report says
so. A later candidate starts only if the time left holds what the first took (no candidate does less work; the
first's analysis probe aside) plus the larger of the final run held back and its own final run at the first's
factor. A candidate whose final run no longer fits the time left when the choice is made is not chosen (the
first always may be). The final run runs the chosen candidate's config, not its calibration: it chooses the
clip again on every calibration sample (``quantcore.auto.budget``: within the budget, or it keeps the
candidate's clip and says so), so that a candidate chosen as given ends as the fixed recipe would on the same
data. A candidate whose run raises anything (a ``QuantcoreError``, an ONNX Runtime error, a fault of a method
on a model it does not suit) is recorded with the error and skipped; cancellation, or whatever the caller's
own check raises (a worker's time limit), is not an error of the candidate and ends the search.

A base candidate (``Candidate.base``: full int8 weights where the CPU chose 7-bit ones) changes how the model
is deployed, which every method composes with: where it is kept over the candidates before it, the
candidates after it vary its config, not the config as given, and say so in their ``change``. Where the
deployment favours latency, it is the base only if its deployed model is not clearly slower than the config
as given's (``_as_base``); its ``change`` says which, and why.

A candidate whose run the parity check re-exported on another weight grid (``quantcore.evaluate.parity.remedy``:
full int8 weights whose deployed model disagreed with exact Q/DQ, re-exported with 7-bit ones) is recorded with
that as its error, unscored: its model is the config as given's grid, not the one it names.

A candidate whose method would change nothing in the prepared model (``Candidate.unchanged``: equalization
without a layer pair, bias correction where the weights are already on their grids, say) is recorded as
skipped, with why, without a run: its run would be the config as given again, at a candidate's cost.

Fallback: when no candidate meets the objective, and the time left holds the fallback's run (at least what the
first candidate took) with the best one's final run after it, the best one is run again with
``target = objective`` (``quantcore.analysis.accuracy_target``: without the bias correction, the
reconstruction and the mixed precision it cannot be combined with), still on the selection split; the
float layers it keeps are added to the chosen config's ``exclude_node_patterns``, so the final run, which
never sees a target, keeps them in float too.
"""

from __future__ import annotations

import glob
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from quantcore.analysis.accuracy_target import measure
from quantcore.auto.budget import FinalRun
from quantcore.auto.candidates import Candidate
from quantcore.auto.scoring import choose, sample_sums
from quantcore.auto.selection import SelectionSplit
from quantcore.auto.timing import Memo, p50_change, time_models
from quantcore.config import QuantizeConfig
from quantcore.errors import Canceled, QuantcoreError
from quantcore.evaluate.cpu_latency import LatencySettings, cpu_latency
from quantcore.evaluate.paired_latency import compare
from quantcore.numerics.paired_scores import SampleSums, difference
from quantcore.pipeline import STAGES, quantize
from quantcore.pipeline.quantization import prepare_on_data
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import InputSpec
from quantcore.runtime.session import error_line

STAGE = "auto"
REMEDIED = "not run as asked: its deployed model disagreed with exact Q/DQ, and the parity check re-exported it"
BUDGET_SPENT = "stopped: the time left, the final run held back, could not hold the rest of this candidate"
# Each candidate's latency: the deployed model at batch 1 only, briefly (a ranking, not a benchmark).
CANDIDATE_LATENCY = LatencySettings(warmup=2, runs=20, budget_s=0.5, batch_sizes=(1,))
# A stage's end is projected from its pace once this share of it is done: AdaRound's first blocks are
# not all its blocks, and a projection from fewer stops a run that would have fitted.
PROJECT_FROM = 0.1


class ProbeStopped(QuantcoreError):
    """The budget stopped a candidate's analysis probe, not the candidate: raised by its ``Deadline`` inside the
    analyze stage, which goes on without the analysis (``quantcore.pipeline.diagnosis``: an analysis that
    fails is recorded as a warning where no target needs it)."""


class Deadline:
    """A candidate's ``should_cancel``: the caller's, then the budget's (``deadline``: a ``perf_counter``
    time, None: none). True once the time left no longer holds ``reserve`` seconds (the final run held
    back) nor the run's own final run (``final``'s estimate from the run's stage seconds, ``analysis`` the
    probe's estimate, None: this run probes it; no ``final``: none), both counted at the projected end of
    the stage it is in (``progressed``: the stage's seconds so far over its done share, from
    ``PROJECT_FROM``): a candidate that cannot finish in time, AdaRound on a large model, stops early rather
    than spend the time left. ``probe``: the run's analyze stage is the analysis probe alone (no target needs
    its ranking), so a budget spent there raises ``ProbeStopped`` instead, once (``probe_stopped``: the
    seconds the probe had run), and the rest of the run goes on unbounded by the budget: it has nothing left
    to run but scoring. ``user_asked`` tells a cancellation from a budget spent."""

    def __init__(
        self,
        monitor: Monitor,
        deadline: float | None,
        reserve: float = 0.0,
        final: FinalRun | None = None,
        analysis: float | None = None,
        probe: bool = False,
    ) -> None:
        self.monitor = monitor
        self.deadline = deadline
        self.reserve = reserve
        self.final = final
        self.analysis = analysis
        self.probe = probe
        self.probe_stopped: float | None = None
        self.started = time.perf_counter()
        self.stage: tuple[str, float] | None = None  # the stage the run is in, since when
        self.fraction = 0.0  # its done share
        self.stage_end = self.started  # its projected end
        self.stage_seconds: dict[str, float] = {}  # the stages before it
        self.user_asked = False
        self.raised: BaseException | None = None  # what the caller's check raised (e.g. a worker's time limit)

    def progressed(self, stage: str, fraction: float) -> None:
        """The run's progress: ``fraction`` of ``stage`` done."""
        now = time.perf_counter()
        if self.stage is None or self.stage[0] != stage:
            if self.stage is not None:
                self.stage_seconds[self.stage[0]] = now - self.stage[1]
            self.stage = (stage, now)
        self.fraction = fraction
        elapsed = now - self.stage[1]
        self.stage_end = now + (elapsed * (1 - fraction) / fraction if fraction >= PROJECT_FROM else 0.0)

    def __call__(self) -> bool:
        try:
            asked = self.monitor.should_cancel is not None and self.monitor.should_cancel()
        except BaseException as error:
            self.raised = error
            raise
        if asked:
            self.user_asked = True
            return True
        if self.deadline is None or self.probe_stopped is not None:
            return False
        now = time.perf_counter()
        end = max(now, self.stage_end)
        spent = end + max(self.reserve, self.own_final(end)) > self.deadline
        if spent and self.probe and self.stage is not None and self.stage[0] == "analyze" and self.fraction < 1.0:
            # the candidate's model and evaluation are done: only the probe is given up
            self.probe_stopped = now - self.stage[1]
            raise ProbeStopped("the analysis probe was stopped by the budget")
        return spent

    def own_final(self, end: float) -> float:
        """The run's own final run, were the run to end at ``end`` (a ``perf_counter`` time) with the stage it
        is in."""
        if self.final is None:
            return 0.0
        stages = dict(self.stage_seconds)
        if self.stage is not None:
            stages[self.stage[0]] = end - self.stage[1]
        analysis = self.final.analysis(stages) if self.analysis is None else self.analysis
        return self.final.seconds(end - self.started, stages, analysis)


@dataclass(frozen=True)
class Tried:
    """One candidate's outcome on the selection split; ``value`` None: undefined, or the candidate failed
    (``error`` says why)."""

    name: str
    change: str
    config: QuantizeConfig  # the candidate's config with the user's measurement options (the final run's, which
    # chooses its clip again on every calibration sample)
    value: float | None
    met: bool
    qdq_bytes: int | None
    latency_p50_ms: float | None  # the deployed model at batch 1 on the CPU EP; None: not measured
    seconds: float
    error: str | None
    sums: SampleSums | None = None  # per selection sample, for the paired comparison; None: no model
    final_seconds: float | None = None  # its final run's estimate (see module); None: no model
    clip_seconds: float = 0.0  # of ``final_seconds``, the final run's clip search (``FinalRun.clip``)
    kept_clip: tuple[float, str] | None = None  # (percentile, clip) its run went on with; None: no model
    analysis_seconds: float = 0.0  # the final run's analysis but its layer-wise runs, as the probe measured it
    probe_seconds: float = 0.0  # of ``seconds``, those its run spent on the analysis probe (the first's)
    probe_stopped: str | None = None  # why its probe was stopped (the final run then runs no analysis); None: not
    difference: dict[str, float] | None = None  # its score minus the chosen one's, 95 % interval (``choose_among``)
    model_path: str | None = None  # its QDQ model, in the search's directory; None: no model
    sample_seconds: float | None = None  # its deployed model's seconds per sample, at most (``quantcore.auto.timing``)

    @property
    def run_seconds(self) -> float:
        """Its seconds without the analysis probe: the least a later candidate's run, or the fallback's, takes."""
        return self.seconds - self.probe_seconds

    def to_dict(self, pareto: bool) -> dict[str, Any]:
        return {
            "name": self.name,
            "change": self.change,
            "value": self.value,
            "met": self.met,
            "qdq_bytes": self.qdq_bytes,
            "latency_p50_ms": self.latency_p50_ms,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "pareto": pareto,
            "final_seconds": None if self.final_seconds is None else round(self.final_seconds, 3),
            "difference": self.difference,
        }


@dataclass(frozen=True)
class Search:
    """The inputs every candidate run shares: the model, its inputs, the split, the selection split's labels
    (the FP32 predictions, for a ``top1_drop`` objective; else None), the directory candidates run in, the
    caller's callbacks, and the final run's estimate (``quantcore.auto.budget``)."""

    model_path: str | Path
    specs: list[InputSpec]
    split: SelectionSplit
    labels: np.ndarray | None
    work_dir: Path
    monitor: Monitor
    final: FinalRun
    timed: Memo = field(default_factory=dict)  # candidates' models timed together (``quantcore.auto.timing``)

    def run(
        self, config: QuantizeConfig, name: str, should_cancel: Callable[[], bool], report: Callable[[str, float], None]
    ) -> dict[str, Any]:
        """``quantize``'s report of ``config`` calibrated on the split's calibration part and evaluated on its
        selection part, in ``work_dir / name``; ``report(stage, fraction)``: the candidate's progress."""
        result = quantize(
            self.model_path,
            self.split.calibration,
            self.split.selection,
            config,
            self.work_dir / name,
            labels=self.labels,
            progress=lambda stage, fraction, _message: report(stage, fraction),
            should_cancel=should_cancel,
        )
        return result.report | {"model_path": result.model_path}


def _quiet(config: QuantizeConfig) -> QuantizeConfig:
    """``config`` with only what scoring needs: no analysis (a target still runs the ranking it needs), CPU
    latency stage, latency placement (the final run places the chosen model) or engine."""
    return replace(
        config,
        analysis=replace(config.analysis, enabled=False),
        cpu_latency=False,
        cpu_objective="accuracy",
        tensorrt_engine=False,
    )


def try_candidate(
    search: Search,
    index: int,
    total: int,
    candidate: Candidate,
    config: QuantizeConfig,
    should_cancel: Deadline,
    analysis: float | None,
) -> Tried:
    """Run candidate ``index`` (0-based) of ``total`` as the module says, stopped by ``should_cancel``;
    ``analysis``: the final run's analysis estimate an earlier run's probe measured, None: this run probes it
    (``quantcore.auto.budget``). Raises ``Canceled`` when the caller asked to stop; a budget spent inside
    the run is recorded as the candidate's error."""
    objective = config.auto.objective
    final = search.final.for_config(config)
    started = time.perf_counter()

    def report(stage: str, fraction: float) -> None:
        should_cancel.progressed(stage, fraction)
        inside = (STAGES.index(stage) + fraction) / len(STAGES)
        search.monitor.report(
            STAGE, (index + inside) / total, f"candidate {index + 1}/{total} {candidate.name}: {stage}"
        )

    def tried(value: float | None, size: int | None, latency: float | None, error: str | None, **more: Any) -> Tried:
        met = error is None and objective.met(value)
        seconds = time.perf_counter() - started
        return Tried(candidate.name, candidate.change, config, value, met, size, latency, seconds, error, **more)

    try:
        quiet = _quiet(config) if analysis is not None else final.probe(_quiet(config))
        result = search.run(quiet, candidate.name, should_cancel, report)
        if result["config"]["reduce_range"] != config.reduce_range:
            # the parity check's remedy re-exported it on the weight grid the config as given runs
            return tried(None, None, None, f"{REMEDIED}: {result['parity']['remedy']}")
        evaluation = result["evaluation"]
        sums = sample_sums(
            search.model_path,
            result["model_path"],
            search.split.selection,
            search.specs,
            evaluation,
            metric=objective.metric,
            labels=search.labels,
            batch_size=config.batch_size,
            device=config.device,
        )
        latency = None
        if config.cpu_latency:  # inside: a model this measurement cannot run is this candidate's fault too
            measured = cpu_latency(
                search.model_path,
                result["model_path"],
                sample=search.split.selection,
                settings=CANDIDATE_LATENCY,
                disabled_optimizers=result["config"]["disabled_optimizers"],
            )
            latency = measured["quantized"].get("batch_1", {}).get("p50_ms")
    except Canceled:
        if should_cancel.user_asked or should_cancel.deadline is None:
            raise
        return tried(None, None, None, BUDGET_SPENT)
    except Exception as error:  # any fault of one candidate's run is that candidate's; the caller's own stop is not
        if error is should_cancel.raised:
            raise
        return tried(None, None, None, error_line(error))
    stage_seconds = result["stage_seconds"]
    per_sample = stage_seconds.get("evaluate", 0.0) / max(sums.samples, 1) if latency is None else latency / 1000.0
    outcome = tried(
        measure(objective, evaluation),
        evaluation["model"]["qdq_bytes"],
        latency,
        None,
        sums=sums,
        model_path=str(result["model_path"]),
        sample_seconds=per_sample,
    )
    if should_cancel.probe_stopped is not None:
        final, analysis = final.without_analysis(), 0.0
        outcome = replace(
            outcome,
            probe_stopped=(
                f"the analysis probe on {candidate.name} was stopped after {should_cancel.probe_stopped:.0f} s, "
                "the final run's analysis it projected not fitting the budget, and the candidate scored without it"
            ),
        )
    analysis = final.analysis(stage_seconds) if analysis is None else analysis
    kept = result["config"]
    outcome = replace(
        outcome,
        final_seconds=final.seconds(outcome.seconds, stage_seconds, analysis),
        clip_seconds=final.clip(stage_seconds),
        kept_clip=(kept["percentile"], kept["clip"]),
        analysis_seconds=analysis,
        probe_seconds=stage_seconds.get("analyze", 0.0),
    )
    shown = "undefined" if outcome.value is None else f"{outcome.value:.6g}"
    search.monitor.report(
        STAGE, (index + 1) / total, f"candidate {index + 1}/{total} {candidate.name}: {objective.metric} {shown}"
    )
    return outcome


def choose_among(tried: list[Tried], higher_is_better: bool, seconds_left: float) -> Tried | None:
    """The candidate kept (``quantcore.auto.scoring.choose``) among those that produced a model and whose final
    run fits ``seconds_left`` (the first always may be); None when none produced a model. Each of them is
    returned with its ``difference`` to the one kept."""
    done = [t for i, t in enumerate(tried) if t.error is None and (i == 0 or t.final_seconds <= seconds_left)]
    if not done:
        return None
    kept = done[choose([t.sums for t in done], [t.met for t in done], higher_is_better)]
    compared = {id(t) for t in done} - {id(kept)}
    for i, t in enumerate(tried):
        if id(t) in compared:
            d = difference(t.sums, kept.sums, higher_is_better)
            finite = all(math.isfinite(v) for v in (d.value, d.low, d.high))  # an undefined score: no interval
            tried[i] = replace(t, difference=d.to_dict() if finite else None)
    return kept


def run_candidates(
    search: Search, candidates: list[tuple[Candidate, QuantizeConfig]], budget_seconds: float, deadline: float
) -> tuple[list[Tried], str | None]:
    """Try ``candidates`` in order within the budget (``deadline``: a ``perf_counter`` time), as the module
    says: (every candidate tried, in order; None, or why the search stopped before the last)."""
    tried: list[Tried] = []
    # a final run's seconds per candidate second, for a candidate not yet run, and its analysis, measured by
    # the first run that produced a model (its analysis by the probe: ``quantcore.auto.budget``)
    factor, analysis = search.final.first_factor, None
    prepared = _Prepared(search)
    base: Tried | None = None  # the base candidate kept, whose config the later ones vary (``Candidate.base``)
    for index, (candidate, config) in enumerate(candidates):
        varied = None if base is None else candidate.applied(base.config)
        if varied is not None:
            config, candidate = varied, replace(candidate, change=f"{candidate.change}, with {base.name}")
        unchanged = prepared.unchanged(candidate, config) if index > 0 else None
        if unchanged is not None:
            shown = f"candidate {index + 1}/{len(candidates)} {candidate.name}: {unchanged}"
            search.monitor.report(STAGE, (index + 1) / len(candidates), shown)
            tried.append(Tried(candidate.name, candidate.change, config, None, False, None, None, 0.0, unchanged))
            continue
        reserve = 0.0
        if index > 0:
            left = deadline - time.perf_counter()
            kept = choose_among(list(tried), config.auto.objective.higher_is_better, left)
            reserve = 0.0 if kept is None else kept.final_seconds
            needed = tried[0].run_seconds  # the others run no probe
            after = max(reserve, factor * needed + (analysis or 0.0) + search.final.held_back)
            if left < needed + after:
                untried = ", ".join(c.name for c, _ in candidates[index:])
                return tried, (
                    f"the budget of {budget_seconds:g} s had {max(0.0, left):.1f} s left, less than {candidate.name} "
                    f"is estimated to take ({needed:.1f} s) with the final run after it ({after:.1f} s): not tried: "
                    f"{untried}"
                )
        final = search.final.for_config(config)
        probe = analysis is None and config.target is None  # a target's ranking is the candidate's, no probe
        should_cancel = Deadline(search.monitor, deadline, reserve, final, analysis, probe=probe)
        tried.append(try_candidate(search, index, len(candidates), candidate, config, should_cancel, analysis))
        last = tried[-1]
        if candidate.base and choose_among(list(tried), config.auto.objective.higher_is_better, math.inf) is last:
            is_base, said = _as_base(search, tried[0], last, config, deadline)
            base = last if is_base else base
            tried[-1] = last = replace(last, change=last.change + said)
        if analysis is None and last.error is None:
            if last.probe_stopped is not None:  # no final run will run the analysis: none held back for it
                search = replace(search, final=search.final.without_analysis())
            analysis = last.analysis_seconds
            factor = (last.final_seconds - analysis - search.final.held_back) / max(last.run_seconds, 1e-9)
        if tried[-1].error == BUDGET_SPENT:
            untried = ", ".join(c.name for c, _ in candidates[index + 1 :]) or "none"
            return tried, (
                f"the budget of {budget_seconds:g} s, the final run held back, ran out during {candidate.name}: "
                f"not tried: {untried}"
            )
    return tried, None


def _as_base(search: Search, first: Tried, base: Tried, config: QuantizeConfig, deadline: float) -> tuple[bool, str]:
    """Whether the ``base`` candidate, more accurate than the ``first`` (the config as given), is the base of the
    later ones, and what its ``change`` adds to say so ("": nothing). Where the deployment favours latency
    (``cpu_objective="latency"``), its deployed model is timed against the first's (``quantcore.auto.timing``,
    in the time left but the final run's), and one clearly slower is not the base: full int8 weights take the
    integer kernels' gain on a CPU without VNNI, and every method built on them would share that cost, so the
    later candidates vary the config as given and the choice among those that meet the objective weighs speed
    (``quantcore.auto.speed``). Untimed (no latency objective, the first produced no model, the timing did not
    fit or ONNX Runtime refused a model): the base, as where accuracy alone decides."""
    if config.cpu_objective != "latency" or first.error is not None:
        return True, ""
    left = deadline - time.perf_counter() - base.final_seconds
    models, per_sample = (first.model_path, base.model_path), (first.sample_seconds, base.sample_seconds)
    timed = time_models(models, per_sample, search.specs, config, left, search.split.selection, search.timed)
    untimed = timed if isinstance(timed, str) else next((t for t in timed.timings if isinstance(t, str)), None)
    if untimed is not None:
        return True, f"; the base of the later candidates untimed ({untimed})"
    theirs, mine = timed.timings
    shown = p50_change(theirs, mine)
    if compare(mine, theirs) != "slower":
        return True, f"; the base of the later candidates: not clearly slower than {first.name} (p50 {shown})"
    return False, (
        f"; not the base of the later candidates: with the deployment favouring latency, its deployed model is "
        f"clearly slower than {first.name}'s (p50 {shown})"
    )


class _Prepared:
    """The model a candidate's prepare stage makes (prepared once, when a candidate first asks), for
    ``Candidate.unchanged``."""

    def __init__(self, search: Search) -> None:
        self.search = search
        self.prepared: PreparedModel | None = None
        self.failed = False

    def unchanged(self, candidate: Candidate, config: QuantizeConfig) -> str | None:
        """``"skipped: ..."`` where ``candidate``'s method would change nothing in the model, else None."""
        if candidate.unchanged is None or self.failed:
            return None
        # a fault here is one the candidate's own run meets too, and records as its error, as any fault
        if self.prepared is None:
            search = self.search
            try:
                self.prepared, _ = prepare_on_data(search.model_path, search.split.calibration, config.batch_size)
            except Exception:
                self.failed = True
                return None
        try:
            reason = candidate.unchanged(self.prepared, config)
        except Exception:
            return None
        return None if reason is None else f"skipped: {reason}, so it would run the config as given again"


def pareto_front(tried: list[Tried], higher_is_better: bool) -> set[str]:
    """Names of the candidates no other beats on accuracy (the objective's metric), CPU latency and size
    together: as good on each, better on one (a candidate with an undefined metric is on the front only if
    it is the smallest or the fastest; latency counts where both were measured)."""
    done = [t for t in tried if t.error is None]

    def costs(t: Tried, o: Tried) -> list[tuple[float, float]]:
        """(t's, o's) on each axis, lower is better."""
        score = [-np.inf if x.value is None else -x.value if higher_is_better else x.value for x in (t, o)]
        axes = [tuple(score), (t.qdq_bytes, o.qdq_bytes)]
        if t.latency_p50_ms is not None and o.latency_p50_ms is not None:
            axes.append((t.latency_p50_ms, o.latency_p50_ms))
        return axes

    def dominated(t: Tried) -> bool:
        return any(
            all(theirs <= mine for mine, theirs in costs(t, o)) and any(theirs < mine for mine, theirs in costs(t, o))
            for o in done
            if o is not t
        )

    return {t.name for t in done if not dominated(t)}


def fallback(search: Search, best: Tried, deadline: float) -> tuple[QuantizeConfig, dict[str, Any]]:
    """The accuracy-target search from ``best`` on the selection split (see the module docstring): the
    config with its float layers excluded, and the report's ``fallback`` entry. Raises ``Canceled`` when
    the caller asked to stop; a failure or a budget spent keeps ``best``'s config, the entry saying why."""
    objective = best.config.auto.objective
    config = replace(
        best.config,
        target=objective,
        bias_correction=False,
        reconstruction=None,
        mixed_precision=None,
        strategy="fixed",
    )
    dropped = [
        name
        for name, on in (
            ("bias correction", best.config.bias_correction),
            ("reconstruction", best.config.reconstruction is not None),
            ("mixed precision", best.config.mixed_precision is not None),
        )
        if on
    ]
    started = time.perf_counter()
    should_cancel = Deadline(search.monitor, deadline, best.final_seconds)  # the final run after it held back
    entry: dict[str, Any] = {
        "from": best.name,
        "dropped": dropped,
        "float_layers": [],
        "value": None,
        "met": False,
        "verdict": None,
    }

    def report(stage: str, fraction: float) -> None:
        search.monitor.report(STAGE, 0.95, f"accuracy-target fallback from {best.name}: {stage} {fraction:.0%}")

    try:
        result = search.run(_quiet(config), "fallback", should_cancel, report)
    except Canceled:
        if should_cancel.user_asked:
            raise
        return best.config, {
            **entry,
            "seconds": round(time.perf_counter() - started, 3),
            "error": "stopped: the budget was spent",
        }
    except Exception as error:  # as a candidate's: the fallback's own fault, recorded; the caller's stop raised
        if error is should_cancel.raised:
            raise
        return best.config, {**entry, "seconds": round(time.perf_counter() - started, 3), "error": error_line(error)}
    target = result["target"]
    layers = target["float_layers"]
    chosen = replace(
        config, target=None, exclude_node_patterns=(*config.exclude_node_patterns, *(glob.escape(n) for n in layers))
    )
    value = next(s["value"] for s in target["steps"] if s["step"] == target["chosen_step"])
    entry = {**entry, "float_layers": layers, "value": value, "met": target["met"], "verdict": target["verdict"]}
    return chosen, {**entry, "seconds": round(time.perf_counter() - started, 3), "error": None}
