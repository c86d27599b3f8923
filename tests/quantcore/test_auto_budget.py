"""strategy auto's budget (quantcore.auto.budget, search.Deadline): a candidate stopped at its projected end,
the final run's estimate and the analysis it may spend, and the analysis probe that stops alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

import quantcore.auto
import quantcore.config.auto
import quantcore.progress
from quantcore import AnalysisOptions, Canceled, QuantizeConfig, quantize_auto
from quantcore.auto import budget as budget_module
from quantcore.auto import search as search_module
from quantcore.auto.budget import FinalRun
from quantcore.auto.search import Search
from tests.quantcore.auto_cases import TimeLimit, auto_config


def test_a_candidate_that_cannot_finish_in_time_stops_at_its_projected_end(small, tmp_path, progress) -> None:
    """AdaRound, on a budget it can start in but not finish in, is stopped once its stage's pace projects an
    end the time left cannot hold, well before the deadline alone would stop it (``progress``'s clock)."""
    path, calibration, evaluation = small
    free = quantize_auto(path, calibration, evaluation, auto_config("adaround"), tmp_path / "free", progress=progress)
    first, adaround = free.report["auto"]["candidates"]
    seconds, final, factor = first["seconds"], first["final_seconds"], first["final_seconds"] / first["seconds"]
    budget = seconds + seconds + final + (adaround["seconds"] - seconds) / 2  # it starts; it cannot finish
    config = auto_config("adaround", budget_seconds=budget)
    section = quantize_auto(path, calibration, evaluation, config, tmp_path / "out", progress=progress).report["auto"]
    stopped = section["candidates"][1]
    assert stopped["name"] == "adaround" and stopped["error"] == search_module.BUDGET_SPENT
    by_deadline = next(e for e in range(1, 10**4) if seconds + e + max(final, factor * e) > budget)
    assert stopped["seconds"] < by_deadline - 5  # 5 progress messages: the stop came from the projection
    assert section["chosen"] == "as_given" and section["seconds"] + section["final_seconds"] <= budget


def test_the_final_run_estimate_on_round_numbers() -> None:
    """``FinalRun``'s formula (``quantcore.auto.budget``): a probe's analysis plus its graph-wise pass on the
    other evaluation samples at evaluate's pace; the stages grown by their ratios, the clip search counted
    once (the final run searches again on the same first samples), the probe's analyze replaced by the
    analysis estimate, the layer-wise seconds held back added (exact arithmetic)."""
    final = FinalRun(scale=(4 / 3, 2.0), graphwise=0.5, layerwise=10.0, latency=0.0)
    stages = {"calibrate": 3.0, "clip": 1.0, "evaluate": 2.0, "analyze": 4.0}
    assert final.analysis(stages) == 4.0 + 0.5 * 2.0 * (2.0 - 1)
    # 12 s, 10 of them in stages: calibrate 3 -> 4, clip 1 -> 1, evaluate 2 -> 4, analyze 4 -> the estimate 5
    assert final.seconds(12.0, stages, 5.0) == pytest.approx(12 + 1 + 2 - 4 + 5 + 10)


def test_the_final_runs_analysis_gets_the_seconds_left_or_is_left_out() -> None:
    """``final_analysis``: the layer-wise runs get what is left after the rest of the final run (its own bound
    where lower); under ``MIN_LAYERWISE_SECONDS`` left, or with no estimate, the analysis is left out."""
    final = FinalRun(scale=(1.0, 1.0), graphwise=1.0, layerwise=10.0, latency=0.0)
    config = QuantizeConfig(analysis=AnalysisOptions(layerwise_seconds=30.0))
    # a final run estimated at 50 s, 10 of them held back for the layer-wise runs: 40 s for the rest
    fitted, note = budget_module.final_analysis(config, 60.0, 50.0, final, 15.0)
    assert fitted.analysis.enabled and fitted.analysis.layerwise_seconds == 20.0 and note is None
    fitted, _ = budget_module.final_analysis(config, 100.0, 50.0, final, 15.0)
    assert fitted.analysis.layerwise_seconds == 30.0  # its own bound
    for left, estimate in ((40.5, 50.0), (60.0, None)):
        fitted, note = budget_module.final_analysis(config, left, estimate, final, 15.0)
        assert not fitted.analysis.enabled and "without the analysis" in note


def test_the_final_runs_clip_search_is_weighed_against_the_analysis_as_fitted_not_as_held_back() -> None:
    """``fit_final_run``: the candidate's final-run estimate (65 s) holds back the whole layer-wise share (12 s);
    with 56 s left the analysis is fitted to the 3 s left over, so the final run as it will run (56 s) holds
    the 9 s clip search again, which is kept. Judged against the held-back 65 s, the clip was dropped for the
    analysis's sake: the model paid for a diagnosis (ocr-rec's auto job, 2.1 dB under its preset). Only once
    the analysis is left out and the rest still does not fit is the candidate's clip kept."""
    final = FinalRun(scale=(1.0, 1.0), graphwise=1.0, layerwise=12.0, latency=0.0)
    config = QuantizeConfig(analysis=AnalysisOptions(layerwise_seconds=120.0))
    kept = (99.99, "percentile")
    fitted, notes = budget_module.fit_final_run(config, 56.0, final, 65.0, 20.0, 9.0, kept, 64)
    assert fitted.analysis.enabled and fitted.analysis.layerwise_seconds == pytest.approx(3.0)
    assert fitted.percentile_candidates == config.percentile_candidates and notes == ()
    # 40 s left: the analysis goes (53 s without its layer-wise runs); the rest, 65 - 20 - 12 = 33 s, fits
    fitted, notes = budget_module.fit_final_run(config, 40.0, final, 65.0, 20.0, 9.0, kept, 64)
    assert not fitted.analysis.enabled and fitted.percentile_candidates == config.percentile_candidates
    assert len(notes) == 1 and "without the analysis" in notes[0]
    # 30 s left: nor does that; the clip chosen on the candidate's samples is kept, and both are said
    fitted, notes = budget_module.fit_final_run(config, 30.0, final, 65.0, 20.0, 9.0, kept, 64)
    assert fitted.percentile_candidates == () and fitted.percentile == 99.99
    assert "without the analysis" in notes[0] and "keeps the chosen candidate's clip" in notes[1]
    # the config as given stopped unscored: no estimate, no clip to keep; the analysis is left out
    fitted, notes = budget_module.fit_final_run(config, 56.0, final, None, 0.0, 0.0, None, 64)
    assert not fitted.analysis.enabled and len(notes) == 1


def test_the_final_runs_analysis_is_probed_held_back_and_bounded(small, tmp_path, monkeypatch) -> None:
    """With the analysis on: the first candidate probes it (everything, its layer-wise runs held to the
    least), the next skips it, each final run's estimate holds back ``LAYERWISE_SHARE`` of the budget for the
    layer-wise runs, and the final run's are held to what the budget left them."""
    path, calibration, evaluation = small
    analyses = []
    original = Search.run

    def run(self, config, name, should_cancel, report):
        analyses.append(config.analysis)
        return original(self, config, name, should_cancel, report)

    monkeypatch.setattr(Search, "run", run)
    budget = 100.0
    config = replace(auto_config("minmax", budget_seconds=budget), analysis=AnalysisOptions(layerwise_seconds=None))
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out")
    section = result.report["auto"]
    probe, other = analyses
    assert probe.enabled and probe.layerwise_seconds == budget_module.MIN_LAYERWISE_SECONDS and not other.enabled
    assert all(c["final_seconds"] >= budget_module.LAYERWISE_SHARE * budget for c in section["candidates"])
    bound = result.report["config"]["analysis"]["layerwise_seconds"]
    assert bound is not None and bound <= budget - section["seconds"]
    assert result.report["analysis"] is not None


@pytest.fixture
def slow_probe(monkeypatch):
    """A progress callback that is the clock, as ``progress``, but the second message of a candidate's analyze
    stage (its first step after the start) advances it by ``slow_probe.cost`` seconds more: the analysis probe
    is slow, the rest of the candidate is not. ``slow_probe.stages`` lists every (stage, message) seen.
    ``perf_counter`` also ticks by 1 ms a call, so the analysis prices its layer-wise runs at a non-zero cost."""
    clock = {"now": 0.0}

    def perf_counter() -> float:
        clock["now"] += 1e-3
        return clock["now"]

    def tick(stage, fraction, message):
        clock["now"] += 1.0
        analyzing = [m.endswith(": analyze") for _, m in tick.stages[-2:]]
        if stage == "auto" and message.endswith(": analyze") and analyzing[-2:] in ([True], [False, True]):
            clock["now"] += tick.cost
        tick.stages.append((stage, message))

    tick.cost, tick.stages = 0.0, []
    monkeypatch.setattr(search_module.time, "perf_counter", perf_counter)
    monkeypatch.setattr(quantcore.config.auto, "AUTO_BUDGET_SECONDS", (1.0, 86_400.0))
    return tick


def test_a_probe_the_budget_cannot_hold_stops_alone_and_its_candidate_is_scored(
    small, tmp_path, slow_probe, recorded_runs
) -> None:
    """On the ``slow_probe`` clock, each step of the first candidate's analysis probe 300 s in a 600 s budget
    (the candidates take about 20 s each without it): the probe's projected end, with the final run's
    analysis it implies, passes the budget, so the probe alone stops. The config as given is scored, the
    search goes on to the next candidate, nothing is held back for an analysis any more, and the final run
    runs without it, the reason saying why. Before, the whole first candidate stopped and nothing was scored."""
    path, calibration, evaluation = small
    slow_probe.cost = 300.0
    budget = 600.0
    config = replace(auto_config("minmax", budget_seconds=budget), analysis=AnalysisOptions())
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out", progress=slow_probe)
    section = result.report["auto"]
    first, second = section["candidates"]
    assert (first["name"], first["error"]) == ("as_given", None) and first["value"] is not None
    assert (second["name"], second["error"]) == ("minmax", None)  # the search went on
    # the probe stopped at its next poll after the slow step, not at the deadline
    assert slow_probe.cost < first["seconds"] < slow_probe.cost + 100
    # no later candidate probes, and no estimate holds back the layer-wise share for an analysis not run
    assert [name for name, _, _ in recorded_runs] == ["as_given", "minmax"]
    assert all(c["final_seconds"] < budget_module.LAYERWISE_SHARE * budget for c in section["candidates"])
    assert "the analysis probe on as_given was stopped after" in section["reason"]
    assert "the final run runs without the analysis" in section["reason"]
    assert not result.report["config"]["analysis"]["enabled"] and result.report["analysis"] is None


@pytest.mark.parametrize("stop", ["cancel", "time limit"])
def test_the_callers_stop_during_the_probe_still_ends_the_search(small, tmp_path, slow_probe, stop) -> None:
    """A cancel, or what a worker's check raises, inside the first candidate's analysis probe is no budget spent:
    it ends the search as anywhere else (the probe's own stop is the budget's only)."""
    path, calibration, evaluation = small

    def should_cancel() -> bool:
        if slow_probe.stages and slow_probe.stages[-1][1].endswith(": analyze"):
            if stop == "time limit":
                raise TimeLimit()
            return True
        return False

    config = replace(auto_config("minmax", budget_seconds=600.0), analysis=AnalysisOptions())
    with pytest.raises(Canceled if stop == "cancel" else TimeLimit):
        quantize_auto(
            path, calibration, evaluation, config, tmp_path / "out", progress=slow_probe, should_cancel=should_cancel
        )


def test_the_deadline_stops_a_probe_once_and_a_candidate_otherwise(monkeypatch) -> None:
    """``Deadline`` past its budget inside the analyze stage: with ``probe``, it raises ``ProbeStopped`` once and
    then leaves the run to finish; without (a target needs the ranking), it stops the run like any stage."""
    clock = {"now": 0.0}
    monkeypatch.setattr(search_module.time, "perf_counter", lambda: clock["now"])
    final = FinalRun(scale=(1.0, 1.0), graphwise=1.0, layerwise=0.0, latency=0.0)
    for probe in (True, False):
        deadline = search_module.Deadline(quantcore.progress.Monitor(), 10.0, final=final, probe=probe)
        deadline.progressed("evaluate", 1.0)
        deadline.progressed("analyze", 0.0)
        assert not deadline()  # on time
        clock["now"] += 8.0  # the analysis so far, 8 s, again in the final run: past the 10 s budget
        if probe:
            with pytest.raises(search_module.ProbeStopped):
                deadline()
            assert deadline.probe_stopped == 8.0 and not deadline()
        else:
            assert deadline() and deadline.probe_stopped is None
        clock["now"] = 0.0
