"""The auto search's budget: the final run's estimated seconds, held back while candidates run, and the
layer-wise analysis the final run may spend.

``auto.budget_seconds`` bounds the search and the final run together. The final run calibrates on every
calibration sample, evaluates on the user's data and runs what the candidates skip
(``quantcore.auto.search``'s ``_quiet``): the analysis and the CPU latency stage. Its seconds are estimated
from a candidate's own (``FinalRun.seconds``):

    final = Σ_stage s_stage · r_stage        r: all / the candidates' calibration samples; for evaluate,
                                             e = evaluation / selection samples; 0 for clip (the final run
                                             keeps the candidate's clip); 1 for the rest (the scoring)
          + analysis                         the analysis but its layer-wise runs, measured by the probe
          + layerwise + latency              seconds held back whatever the candidate

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

A running candidate's own final run is estimated the same way from the stages it has run so far, the
one it is in counted to its projected end (``quantcore.auto.search.Deadline``). A candidate not yet run
is estimated from the seconds of the first that produced a model; where none has, at ``first_factor``
times the first's seconds (every stage grown by the larger ratio) plus what is held back.

The final run's analysis is given the seconds the search left it (``final_analysis``): its layer-wise
runs are held to what is left after the rest of the final run and its analysis estimate; where that is
less than ``MIN_LAYERWISE_SECONDS``, or where the config as given was stopped unscored (no estimate), the
final run runs without the analysis, and the search's reason says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quantcore.config import QuantizeConfig
from quantcore.evaluate.cpu_latency import LatencySettings

# The share of the budget held back for the final run's layer-wise analysis: a diagnosis, next to the
# candidates the budget is for.
LAYERWISE_SHARE = 0.1
# The least the final run's layer-wise runs are given (the analysis runs one layer on one batch at least).
MIN_LAYERWISE_SECONDS = 1.0


@dataclass(frozen=True)
class FinalRun:
    """The final run's estimate (see module): ``scale`` (all / candidates' calibration samples, evaluation /
    selection samples), ``graphwise`` (g), and the seconds held back for the ``layerwise`` runs and the
    ``latency`` stage."""

    scale: tuple[float, float]
    graphwise: float
    layerwise: float
    latency: float

    @classmethod
    def of(cls, config: QuantizeConfig, scale: tuple[float, float], evaluation_samples: int) -> FinalRun:
        """The estimate for ``config`` (the user's, strategy auto) with ``evaluation_samples`` held-out samples."""
        analysis = config.analysis
        graphwise, layerwise = 0.0, 0.0
        if analysis.enabled:
            samples = analysis.graphwise_samples or evaluation_samples
            graphwise = min(1.0, samples / max(evaluation_samples, 1))
            share = LAYERWISE_SHARE * config.auto.budget_seconds
            layerwise = share if analysis.layerwise_seconds is None else min(analysis.layerwise_seconds, share)
        latency = 2 * len(config.cpu_batch_sizes) * (LatencySettings().budget_s or 0.0) if config.cpu_latency else 0.0
        return cls(scale, graphwise, layerwise, latency)

    @property
    def held_back(self) -> float:
        """Seconds held back whatever the candidate: the layer-wise runs and the latency stage."""
        return self.layerwise + self.latency

    @property
    def first_factor(self) -> float:
        """Final-run seconds per candidate second before any candidate has measured its stages."""
        calibration, evaluation = self.scale
        return max(calibration, evaluation)

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

    def seconds(self, seconds: float, stage_seconds: dict[str, float], analysis: float) -> float:
        """A candidate's final run from its ``seconds`` and ``stage_seconds``, ``analysis`` the probe's estimate
        (see module); a probe's own analyze stage is not grown, ``analysis`` stands for it."""
        calibration, evaluation = self.scale
        ratios = {"evaluate": evaluation, "clip": 0.0, "analyze": 0.0}
        grown = seconds + sum(v * (ratios.get(k, calibration) - 1) for k, v in stage_seconds.items())
        return grown + analysis + self.held_back


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
