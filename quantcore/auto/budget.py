"""The auto search's budget: the final run's estimated seconds, held back while candidates run, and the
layer-wise analysis and the clip search the final run may spend.

``auto.budget_seconds`` bounds the search and the final run together. The final run calibrates on every
calibration sample, so it chooses its clip again on them (``quantcore.calibrate.clip_search``: the
percentile or MSE threshold the candidate chose on its own samples need not be the one all of them
choose), evaluates on the user's data and runs what the candidates skip (``quantcore.auto.search``'s
``_quiet``): the analysis and the CPU latency stage. Its seconds are estimated from a candidate's own
(``FinalRun.seconds``):

    final = Σ_stage s_stage · r_stage        r: all / the candidates' calibration samples; for evaluate,
                                             e = evaluation / selection samples; 1 for the rest (the
                                             scoring, and the clip search, which scores its clips on the
                                             first SEARCH_SAMPLES calibration samples in both runs)
          + clip                             where the candidate had too few samples to search its clip
                                             and the final run has enough: c · s_evaluate (``unsearched_clip``)
          + analysis                         the analysis but its layer-wise runs, measured by the probe
          + layerwise + latency              seconds held back whatever the candidate

c, from evaluate's pace per model run and sample: evaluate runs three models (FP32, exact Q/DQ, deployed)
on the selection samples, the clip search the FP32 model and one exact Q/DQ model per clip on
min(all, SEARCH_SAMPLES) samples: c = (1 + clips) / 3 · min(all, SEARCH_SAMPLES) / selection.

The analysis (``quantcore.analysis.ranking``) builds its models and sessions (one per layer-wise cone),
prices the layer-wise runs, runs the graph-wise pass over the evaluation batches, then the layer-wise runs,
which alone it bounds (``AnalysisOptions.layerwise_seconds``). So the first candidate runs it as a probe
(``probe``: everything, the layer-wise runs held to ``MIN_LAYERWISE_SECONDS``) on the selection split, and
the final run's analysis is its seconds plus the graph-wise pass on the other evaluation samples at
evaluate's pace (``analysis``: + g · s_evaluate · (e - 1), g the graph-wise samples over the evaluation's).
The search holds back ``LAYERWISE_SHARE`` of the budget for the layer-wise runs (the config's own bound
where lower), and the final run is given what the search left them (``final_analysis``). The latency stage
measures two models at each of ``cpu_batch_sizes`` for about ``LatencySettings.budget_s`` each. Not
estimated: the engine build (GPU workers) and the CPU alternative, which come on top where they run.

The probe is a diagnosis's estimate, not part of the candidate: where its projected end, with the final
run's analysis it implies, no longer fits the budget, the probe alone is stopped
(``quantcore.auto.search.Deadline``) and its candidate goes on to be scored. The final run then runs without
the analysis (``without_analysis``: nothing held back for it, in every candidate's estimate from then on),
and the reason says so; no later candidate probes again.

A running candidate's own final run is estimated the same way from the stages it has run so far, the
one it is in counted to its projected end (``quantcore.auto.search.Deadline``). A candidate not yet run
is estimated from the seconds of the first that produced a model; where none has, at ``first_factor``
times the first's seconds (every stage grown by the larger ratio) plus what is held back.

What the search left is spent in this order (``fit_final_run``: ``final_analysis``, then ``final_clip``):
the analysis, a diagnosis, goes first: its layer-wise runs are held to what is left after the rest of the
final run and its analysis estimate; where that is less than ``MIN_LAYERWISE_SECONDS``, or where the
config as given was stopped unscored (no estimate), the final run runs without the analysis. The clip
search, which changes the model, goes only where the final run without the analysis still does not fit:
the final run then keeps the clip the chosen candidate's run kept. The search's reason says which was
left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quantcore.calibrate.calibration import configured_clip
from quantcore.calibrate.clip_search import MIN_SAMPLES, SEARCH_SAMPLES
from quantcore.config import QuantizeConfig
from quantcore.evaluate.cpu_latency import LatencySettings

# The share of the budget held back for the final run's layer-wise analysis: a diagnosis, next to the
# candidates the budget is for.
LAYERWISE_SHARE = 0.1
# The least the final run's layer-wise runs are given (the analysis runs one layer on one batch at least).
MIN_LAYERWISE_SECONDS = 1.0
# The models the evaluate stage runs on each sample: FP32, exact Q/DQ and as deployed.
EVALUATE_RUNS = 3


@dataclass(frozen=True)
class FinalRun:
    """The final run's estimate (see module): ``scale`` (all / candidates' calibration samples, evaluation /
    selection samples), ``graphwise`` (g), the seconds held back for the ``layerwise`` runs and the
    ``latency`` stage, and ``unsearched_clip`` (c; 0.0 where the final run searches no clip the candidates
    did not)."""

    scale: tuple[float, float]
    graphwise: float
    layerwise: float
    latency: float
    unsearched_clip: float = 0.0

    @classmethod
    def of(cls, config: QuantizeConfig, samples: tuple[int, int], evaluation_samples: int) -> FinalRun:
        """The estimate for ``config`` (the user's, strategy auto), ``samples`` the candidates' calibration
        and selection samples, with ``evaluation_samples`` held-out samples."""
        calibration, selection = samples
        total = calibration + selection
        scale = (total / calibration, evaluation_samples / selection)
        unsearched_clip = 0.0
        if config.percentile_candidates and calibration < MIN_SAMPLES <= total:  # clip_search's own condition
            clips = len({*config.percentile_candidates, "mse", configured_clip(config)})
            unsearched_clip = (1 + clips) / EVALUATE_RUNS * min(total, SEARCH_SAMPLES) / selection
        analysis = config.analysis
        graphwise, layerwise = 0.0, 0.0
        if analysis.enabled:
            samples = analysis.graphwise_samples or evaluation_samples
            graphwise = min(1.0, samples / max(evaluation_samples, 1))
            share = LAYERWISE_SHARE * config.auto.budget_seconds
            layerwise = share if analysis.layerwise_seconds is None else min(analysis.layerwise_seconds, share)
        latency = 2 * len(config.cpu_batch_sizes) * (LatencySettings().budget_s or 0.0) if config.cpu_latency else 0.0
        return cls(scale, graphwise, layerwise, latency, unsearched_clip)

    def for_config(self, config: QuantizeConfig) -> FinalRun:
        """The estimate for a candidate's ``config``: without ``unsearched_clip`` where no activation is observed
        by ``percentile`` (no clip to search: an observer candidate's)."""
        percentile = config.observer == "percentile" or any(o.observer == "percentile" for o in config.overrides)
        return self if percentile else replace(self, unsearched_clip=0.0)

    @property
    def held_back(self) -> float:
        """Seconds held back whatever the candidate: the layer-wise runs and the latency stage."""
        return self.layerwise + self.latency

    @property
    def first_factor(self) -> float:
        """Final-run seconds per candidate second before any candidate has measured its stages."""
        calibration, evaluation = self.scale
        return max(calibration, evaluation)

    def without_analysis(self) -> FinalRun:
        """The estimate for a final run that runs no analysis (its probe was stopped: see module)."""
        return replace(self, graphwise=0.0, layerwise=0.0)

    def probe(self, config: QuantizeConfig) -> QuantizeConfig:
        """``config`` (a candidate's) with the analysis probe on (see module); unchanged without analysis."""
        if self.graphwise == 0.0:
            return config
        return replace(config, analysis=replace(config.analysis, enabled=True, layerwise_seconds=MIN_LAYERWISE_SECONDS))

    def analysis(self, stage_seconds: dict[str, float]) -> float:
        """The final run's analysis but its layer-wise runs, from a probe's ``stage_seconds`` (see module)."""
        if "analyze" not in stage_seconds:
            return 0.0
        return stage_seconds["analyze"] + self.graphwise * stage_seconds["evaluate"] * (self.scale[1] - 1)

    def clip(self, stage_seconds: dict[str, float]) -> float:
        """The final run's clip search, from a candidate's ``stage_seconds`` (see module): the candidate's own
        where it searched, else ``unsearched_clip`` times its evaluate stage."""
        if "clip" in stage_seconds:
            return stage_seconds["clip"]
        return self.unsearched_clip * stage_seconds.get("evaluate", 0.0)

    def seconds(self, seconds: float, stage_seconds: dict[str, float], analysis: float) -> float:
        """A candidate's final run from its ``seconds`` and ``stage_seconds``, ``analysis`` the probe's estimate
        (see module); a probe's own analyze stage is not grown, ``analysis`` stands for it, and the clip
        stage is ``clip``'s."""
        calibration, evaluation = self.scale
        ratios = {"evaluate": evaluation, "clip": 0.0, "analyze": 0.0}
        grown = seconds + sum(v * (ratios.get(k, calibration) - 1) for k, v in stage_seconds.items())
        return grown + self.clip(stage_seconds) + analysis + self.held_back


def final_analysis(
    config: QuantizeConfig, seconds_left: float, final_seconds: float | None, final: FinalRun, analysis: float
) -> tuple[QuantizeConfig, str | None]:
    """``config`` (the chosen one) with its analysis fitted to ``seconds_left`` as the module says, and why it
    was left out (None: it was not). ``final_seconds``: the chosen candidate's final run estimate (None: the
    config as given, stopped unscored), ``analysis`` the part of it that is the analysis but its layer-wise runs."""
    current = config.analysis
    if not current.enabled:
        return config, None
    if final_seconds is None:
        off = "the final run runs without the analysis: the budget could not hold the config as given with it"
        return replace(config, analysis=replace(current, enabled=False)), off
    room = seconds_left - (final_seconds - final.layerwise)  # after the rest of the final run and its analysis
    if room < MIN_LAYERWISE_SECONDS:
        off = (
            f"the final run runs without the analysis: with it (about {analysis + MIN_LAYERWISE_SECONDS:.0f} s) "
            f"the final run would not fit the {max(seconds_left, 0.0):.0f} s left"
        )
        return replace(config, analysis=replace(current, enabled=False)), off
    own = current.layerwise_seconds
    bound = room if own is None else min(own, room)
    return replace(config, analysis=replace(current, layerwise_seconds=bound)), None


def _fitted_seconds(
    config: QuantizeConfig, final_seconds: float, final: FinalRun, analysis: float, left_out: bool
) -> float:
    """The final run's estimate as ``config`` (``final_analysis``'s) will run it, from ``final_seconds`` (the
    chosen candidate's, which holds ``final.layerwise`` back for the layer-wise runs): the layer-wise runs at
    the bound they were fitted to, or, the analysis ``left_out``, without ``analysis`` and them."""
    if left_out:
        return final_seconds - analysis - final.layerwise
    if config.analysis.enabled and config.analysis.layerwise_seconds is not None:
        return final_seconds - final.layerwise + config.analysis.layerwise_seconds
    return final_seconds


def final_clip(
    config: QuantizeConfig,
    seconds_left: float,
    final_seconds: float,
    clip_seconds: float,
    kept: tuple[float, str],
    calibration_samples: int,
) -> tuple[QuantizeConfig, str | None]:
    """``config`` (the chosen one, its analysis fitted by ``final_analysis``) as the final run runs it, and
    why its clip is not chosen again on all ``calibration_samples`` (None: it is, or there is no clip to
    choose). ``final_seconds``: the final run's estimate as it will run (without the analysis where that
    was left out), ``clip_seconds`` the part of it that is the clip search, ``kept`` the (percentile, clip)
    the chosen candidate's run went on with. The search is dropped only where the final run does not fit
    ``seconds_left`` with it and the clip search is part of the estimate (see module)."""
    if clip_seconds <= 0.0 or final_seconds <= seconds_left:
        return config, None
    percentile, clip = kept
    name = "the MSE threshold" if clip == "mse" else f"percentile {percentile:g}"
    note = (
        f"the final run keeps the chosen candidate's clip ({name}) rather than choosing it again on all "
        f"{calibration_samples} calibration samples: that search (about {clip_seconds:.0f} s) would not fit "
        f"the {max(seconds_left, 0.0):.0f} s left"
    )
    return replace(config, percentile=percentile, clip=clip, percentile_candidates=()), note


def fit_final_run(
    config: QuantizeConfig,
    seconds_left: float,
    final: FinalRun,
    final_seconds: float | None,
    analysis: float,
    clip_seconds: float,
    kept: tuple[float, str] | None,
    calibration_samples: int,
) -> tuple[QuantizeConfig, tuple[str, ...]]:
    """``config`` (the chosen one) as the final run runs it in ``seconds_left``, and what it leaves out, in
    the module's order: its analysis fitted first (``final_analysis``), then its clip search kept or dropped
    (``final_clip``) against the estimate as the analysis was fitted, not as the candidate's held back the
    whole layer-wise share (which would drop a search that fits, for the analysis's sake). ``final_seconds``,
    ``analysis``, ``clip_seconds`` and ``kept``: the chosen candidate's (``kept`` None: it was not scored)."""
    config, analysis_note = final_analysis(config, seconds_left, final_seconds, final, analysis)
    clip_note = None
    if kept is not None and final_seconds is not None:
        estimate = _fitted_seconds(config, final_seconds, final, analysis, analysis_note is not None)
        config, clip_note = final_clip(config, seconds_left, estimate, clip_seconds, kept, calibration_samples)
    return config, tuple(note for note in (analysis_note, clip_note) if note is not None)
