"""strategy auto (quantcore.auto): the selection split, the choice, failures, the budget, cancellation,
the accuracy-target fallback, and that strategy fixed never enters the search (the budget's estimates and
stops: test_auto_budget.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quantcore.auto
import quantcore.config.auto
import quantcore.progress
from quantcore import AnalysisOptions, Canceled, QuantizeConfig, prepare, quantize, quantize_auto
from quantcore.auto import budget as budget_module
from quantcore.auto import candidates as candidates_module
from quantcore.auto import scoring
from quantcore.auto import search as search_module
from quantcore.auto.budget import FinalRun
from quantcore.auto.candidates import CANDIDATES
from quantcore.auto.search import REMEDIED, Search
from quantcore.config import AUTO_CANDIDATES, AccuracyTarget
from quantcore.errors import UnsupportedModelError
from quantcore.numerics import paired_scores
from quantcore.runtime import cpu_features
from tests.quantcore.auto_cases import NO_ANALYSIS, TimeLimit, auto_config, rows
from tests.quantcore.models import conv_relu_gemm, planted_outlier, save


def test_candidate_names_match_the_config(small) -> None:
    assert tuple(c.name for c in CANDIDATES) == AUTO_CANDIDATES


def test_selection_split_is_disjoint_from_calibration_and_evaluation(
    small, tmp_path, monkeypatch, recorded_runs
) -> None:
    path, calibration, evaluation = small
    final = []
    final_quantize = quantcore.auto.quantize

    def final_run(*args, **kwargs):
        final.append(args[1:3])
        return final_quantize(*args, **kwargs)

    monkeypatch.setattr(quantcore.auto, "quantize", final_run)
    result = quantize_auto(path, calibration, evaluation, auto_config("minmax"), tmp_path / "out")
    assert [name for name, _, _ in recorded_runs] == ["as_given", "minmax"]
    selection = rows(recorded_runs[0][2])
    assert len(selection) == 10  # 25 % of 40, above the minimum of 8
    for _, calibrated, scored in recorded_runs:
        assert rows(scored) == selection
        assert not rows(calibrated) & selection and rows(calibrated) | selection == rows(calibration)
    assert not selection & rows(evaluation)  # the search never sees the evaluation data
    ((final_calibration, final_evaluation),) = final  # the final run: every calibration sample, the user's evaluation
    assert rows(final_calibration) == rows(calibration) and rows(final_evaluation) == rows(evaluation)
    section = result.report["auto"]
    assert section["selection"] == {"calibration_samples": 30, "selection_samples": 10, "fraction": 0.25}
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".auto-")]  # candidates cleaned up


def test_the_chosen_candidate_is_one_no_other_beats_beyond_the_interval(small, tmp_path) -> None:
    path, calibration, evaluation = small
    result = quantize_auto(path, calibration, evaluation, auto_config("minmax", "mse", "kl"), tmp_path / "out")
    section = result.report["auto"]
    candidates = {c["name"]: c for c in section["candidates"]}
    assert list(candidates) == ["as_given", "minmax", "mse", "kl"] and None not in [
        c["value"] for c in candidates.values()
    ]
    chosen = section["chosen"]
    assert candidates[chosen]["difference"] is None  # each other's difference is against the chosen one
    assert all(c["difference"]["low"] <= 0 for name, c in candidates.items() if name != chosen)
    assert section["met"] and section["fallback"] is None and chosen in section["reason"]
    assert any(c["pareto"] for c in section["candidates"] if c["name"] == chosen)
    chosen_observer = "percentile" if chosen == "as_given" else chosen
    assert result.report["config"]["observer"] == chosen_observer and result.report["config"]["strategy"] == "fixed"
    assert result.report["evaluation"]["num_samples"] == 16  # the final run evaluates on the user's data


def test_a_later_candidate_better_only_within_noise_does_not_replace_the_earlier(small, tmp_path) -> None:
    """At percentile 99.9 minmax scores a higher cosine on the 10 selection samples than the config as given
    (by about 7e-5), but the paired interval of the difference spans 0: the config as given is kept."""
    path, calibration, evaluation = small
    config = replace(auto_config("minmax"), percentile=99.9, percentile_candidates=())
    section = quantize_auto(path, calibration, evaluation, config, tmp_path / "out").report["auto"]
    as_given, minmax = section["candidates"]
    assert minmax["value"] > as_given["value"]  # what the best score alone would have chosen
    assert minmax["difference"]["low"] < 0 < minmax["difference"]["high"]
    assert section["chosen"] == "as_given" and "within noise" in section["reason"]


def test_a_later_candidate_better_beyond_noise_is_chosen(small, tmp_path) -> None:
    """Clipping every activation at its 90th percentile costs a cosine of about 0.05 on every sample:
    minmax is better beyond the interval and replaces the config as given."""
    path, calibration, evaluation = small
    config = replace(auto_config("minmax"), percentile=90.0, percentile_candidates=())
    section = quantize_auto(path, calibration, evaluation, config, tmp_path / "out").report["auto"]
    as_given, _ = section["candidates"]
    assert section["chosen"] == "minmax" and as_given["difference"]["high"] < 0


def test_per_sample_scores_reproduce_the_objective_value(small, tmp_path, monkeypatch) -> None:
    """The paired comparison resamples per-sample sums; over all samples they give the candidate's value as
    the evaluation measured it (float64 sums in another order: 1e-9)."""
    path, calibration, evaluation = small
    recorded = []

    def record(*args, **kwargs):
        recorded.append(scoring.sample_sums(*args, **kwargs))
        return recorded[-1]

    monkeypatch.setattr(search_module, "sample_sums", record)
    for metric, value in (("cosine", 0.99), ("sqnr", 20.0)):
        recorded.clear()
        config = auto_config("minmax", "kl", objective=AccuracyTarget(metric, value))
        section = quantize_auto(path, calibration, evaluation, config, tmp_path / metric).report["auto"]
        for candidate, sums in zip(section["candidates"], recorded, strict=True):
            assert sums.samples == 10
            assert sums.scores(np.arange(10)) == pytest.approx(candidate["value"], rel=1e-9)


def test_identical_candidates_differ_by_nothing() -> None:
    rng = np.random.default_rng(0)
    sums = paired_scores.SampleSums("cosine", {"out": np.abs(rng.normal(size=(12, 4)))})
    d = paired_scores.difference(sums, sums, higher_is_better=True)
    assert (d.value, d.low, d.high) == (0.0, 0.0, 0.0) and not d.beyond
    assert scoring.choose([sums, sums], [True, True], higher_is_better=True) == 0


def test_an_undefined_score_is_beaten_by_any_defined_one() -> None:
    rng = np.random.default_rng(0)
    columns = np.abs(rng.normal(size=(12, 4)))
    undefined = paired_scores.SampleSums("sqnr", {"out": columns}, defined=False)  # non-finite outputs
    defined = paired_scores.SampleSums("sqnr", {"out": columns})
    assert paired_scores.difference(defined, undefined, higher_is_better=True).beyond
    assert scoring.choose([undefined, defined], [False, False], higher_is_better=True) == 1


def test_the_final_run_chooses_its_clip_again_on_every_calibration_sample(tmp_path, monkeypatch) -> None:
    """The candidates calibrate on the first 48 of 64 samples and choose their clip there; the last 16, the
    selection split, ten times larger, move the choice made on all 64. The config as given, chosen, must end
    as the fixed recipe on the same data does: its clip chosen again on all 64, the same model."""
    rng = np.random.default_rng(0)
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    samples = rng.normal(size=(64, 2, 6, 6)).astype(np.float32)
    samples[48:] *= 10.0
    calibration, evaluation = {"input": samples}, {"input": rng.normal(size=(16, 2, 6, 6)).astype(np.float32)}
    searched = {}
    original = Search.run

    def run(self, config, name, should_cancel, report):
        result = original(self, config, name, should_cancel, report)
        searched[name] = result["calibration"]["percentile_search"]
        return result

    monkeypatch.setattr(Search, "run", run)
    # an objective the config as given meets on the selection split (cosine 0.77 there, its samples ten times
    # those it calibrated on): no accuracy-target fallback, the final run is the config as given
    config = auto_config("as_given", objective=AccuracyTarget("cosine", 0.5))
    auto = quantize_auto(path, calibration, evaluation, config, tmp_path / "auto")
    fixed = quantize(path, calibration, evaluation, replace(config, strategy="fixed"), tmp_path / "fixed")
    chosen = fixed.report["calibration"]["percentile_search"]
    # the premise: on 48 samples the candidate chose another clip than all 64 choose
    assert searched["as_given"]["samples"] > 0 and chosen["samples"] > 0
    assert (searched["as_given"]["clip"], searched["as_given"]["chosen"]) != (chosen["clip"], chosen["chosen"])
    assert auto.report["auto"]["chosen"] == "as_given"
    assert auto.report["calibration"]["percentile_search"] == chosen
    assert auto.report["config"] == fixed.report["config"]
    # the same model: every initializer (weights, scales, offsets) and node, byte for byte
    auto_graph, fixed_graph = (onnx.load(str(r.model_path)).graph for r in (auto, fixed))
    assert auto_graph.SerializeToString() == fixed_graph.SerializeToString()


def test_the_final_runs_clip_search_is_estimated_and_kept_where_it_cannot_fit() -> None:
    """``FinalRun``: the clip stage of a candidate that searched counts once (both runs score the clips on the
    same first samples); where the candidates had too few samples to search (42 of 56) and the final run has
    enough, it is estimated at evaluate's pace, for the candidates that observe by percentile only.
    ``final_clip``: the search again is dropped, the candidate's clip kept and said, only where the final run
    does not fit the time left with it."""
    config = QuantizeConfig(analysis=NO_ANALYSIS, cpu_latency=False)
    final = FinalRun.of(config, (48, 16), 32)
    assert final.scale == (64 / 48, 2.0) and final.unsearched_clip == 0.0
    assert final.clip({"calibrate": 3.0, "clip": 5.0, "evaluate": 2.0}) == 5.0
    unsearched = FinalRun.of(config, (42, 14), 32)
    # the FP32 model and one exact Q/DQ model per clip (99.9, 99.99, 99.999, 100, mse) on 32 samples, against
    # evaluate's three models on 14
    assert unsearched.unsearched_clip == pytest.approx((1 + 5) / 3 * 32 / 14)
    assert unsearched.clip({"calibrate": 3.0, "evaluate": 2.0}) == pytest.approx(2.0 * (1 + 5) / 3 * 32 / 14)
    assert unsearched.for_config(replace(config, observer="minmax")).unsearched_clip == 0.0
    assert FinalRun.of(replace(config, percentile_candidates=()), (42, 14), 32).unsearched_clip == 0.0

    kept, note = budget_module.final_clip(config, 30.0, 30.0, 5.0, (99.9, "percentile"), 64)
    assert kept == config and note is None  # it fits: chosen again
    kept, note = budget_module.final_clip(config, 29.0, 30.0, 5.0, (99.9, "percentile"), 64)
    assert (kept.percentile, kept.clip, kept.percentile_candidates) == (99.9, "percentile", ())
    assert "keeps the chosen candidate's clip (percentile 99.9)" in note and "all 64 calibration samples" in note
    kept, note = budget_module.final_clip(config, 29.0, 30.0, 0.0, (99.9, "percentile"), 64)
    assert kept == config and note is None  # nothing of the estimate to drop: the final run as it is


def test_the_final_run_is_held_back_from_the_budget(small, tmp_path, progress) -> None:
    """On the ``progress`` clock, with a budget of the first candidate's seconds T plus its final run's
    estimate F plus T/2, a second candidate fits the time left (F + T/2 >= T) only if the final run is not
    held back; it is, so the search stops after the first."""
    path, calibration, evaluation = small
    free = quantize_auto(path, calibration, evaluation, auto_config("minmax"), tmp_path / "free", progress=progress)
    first = free.report["auto"]["candidates"][0]
    seconds, final = first["seconds"], first["final_seconds"]
    assert final >= seconds / 2  # the second candidate would have started without the final run held back
    budget = seconds + final + seconds / 2
    config = auto_config("minmax", budget_seconds=budget)
    section = quantize_auto(path, calibration, evaluation, config, tmp_path / "out", progress=progress).report["auto"]
    assert [c["name"] for c in section["candidates"]] == ["as_given"]
    assert "with the final run after it" in section["stopped"] and "not tried: minmax" in section["stopped"]
    assert section["seconds"] + section["final_seconds"] <= budget


def test_a_final_run_that_cannot_afford_its_clip_search_keeps_the_candidates_clip_and_says_so(
    tmp_path, progress, monkeypatch
) -> None:
    """On the ``progress`` clock: once the only candidate is scored, the clock jumps to leave its final run's
    estimate less half its clip search. The final run (its analysis off, nothing else to leave out) then
    keeps the clip the candidate chose on its 48 samples instead of choosing again on all 64, and the reason
    says so."""
    rng = np.random.default_rng(0)
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    calibration = {"input": rng.normal(size=(64, 2, 6, 6)).astype(np.float32)}
    evaluation = {"input": rng.normal(size=(16, 2, 6, 6)).astype(np.float32)}
    budget = 10_000.0
    started, scored = {}, []
    original = search_module.try_candidate

    def clock(stage, fraction, message):
        progress(stage, fraction, message)
        if message == "auto started":  # quantize_auto's start: its deadline is this plus the budget
            started["now"] = search_module.time.perf_counter()

    def try_candidate(*args, **kwargs):
        tried = original(*args, **kwargs)
        scored.append(tried)
        left = tried.final_seconds - tried.clip_seconds / 2
        monkeypatch.setattr(search_module.time, "perf_counter", lambda: started["now"] + budget - left)
        return tried

    monkeypatch.setattr(search_module, "try_candidate", try_candidate)
    config = auto_config("as_given", budget_seconds=budget)
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out", progress=clock)
    (tried,) = scored
    assert tried.clip_seconds > 0  # the candidate searched its clip: the final run would have too
    assert "keeps the chosen candidate's clip" in result.report["auto"]["reason"]
    assert "all 64 calibration samples" in result.report["auto"]["reason"]
    assert result.report["calibration"]["percentile_search"] is None  # the final run did not search
    final = result.report["config"]
    assert (final["percentile"], final["clip"], final["percentile_candidates"]) == (*tried.kept_clip, [])


# ValueError: what a method raises on a model it does not suit (AdaRound's sample cache on a model whose
# activations are sequence-first), not one of quantcore's own errors
@pytest.mark.parametrize("error", [UnsupportedModelError, ValueError])
def test_a_candidate_that_raises_is_recorded_and_skipped(small, tmp_path, monkeypatch, error) -> None:
    path, calibration, evaluation = small
    original = Search.run

    def run(self, config, name, should_cancel, report):
        if name == "mse":
            raise error("mse broke")
        return original(self, config, name, should_cancel, report)

    monkeypatch.setattr(Search, "run", run)
    result = quantize_auto(path, calibration, evaluation, auto_config("minmax", "mse"), tmp_path / "out")
    rows_by_name = {c["name"]: c for c in result.report["auto"]["candidates"]}
    assert rows_by_name["mse"]["error"] == f"{error.__name__}: mse broke" and rows_by_name["mse"]["value"] is None
    assert not rows_by_name["mse"]["pareto"] and result.report["auto"]["chosen"] != "mse"


def test_adaround_raising_on_a_model_it_does_not_suit_is_recorded_and_the_search_goes_on(
    small, tmp_path, monkeypatch
) -> None:
    """AdaRound's own ValueError (its sample cache on a sequence-first model: khmer-seg) raised inside the
    candidate's run, not by the search: the candidate is recorded with it, and the job ends with a model."""

    def reconstruct(*args, **kwargs):
        raise ValueError("could not broadcast input array from shape (64,1,192) into shape (1,1,192)")

    monkeypatch.setattr("quantcore.pipeline.quantization.reconstruct", reconstruct)
    path, calibration, evaluation = small
    result = quantize_auto(path, calibration, evaluation, auto_config("minmax", "adaround"), tmp_path / "out")
    section = result.report["auto"]
    rows_by_name = {c["name"]: c for c in section["candidates"]}
    assert rows_by_name["adaround"]["error"].startswith("ValueError: could not broadcast")
    assert section["chosen"] in ("as_given", "minmax") and section["stopped"] is None
    assert result.model_path.exists()


def test_a_candidate_whose_latency_cannot_be_measured_is_recorded_and_skipped(small, tmp_path, monkeypatch) -> None:
    """The candidates' CPU latency runs their model once more: a fault there is the candidate's as well."""
    original = search_module.cpu_latency

    def cpu_latency(model_path, quantized_path, **kwargs):
        if "minmax" in str(quantized_path):
            raise RuntimeError("latency broke")
        return original(model_path, quantized_path, **kwargs)

    monkeypatch.setattr(search_module, "cpu_latency", cpu_latency)
    path, calibration, evaluation = small
    config = replace(auto_config("minmax"), cpu_latency=True, cpu_batch_sizes=(1,))
    section = quantize_auto(path, calibration, evaluation, config, tmp_path / "out").report["auto"]
    rows_by_name = {c["name"]: c for c in section["candidates"]}
    assert rows_by_name["minmax"]["error"] == "RuntimeError: latency broke"
    assert rows_by_name["as_given"]["latency_p50_ms"] is not None and section["chosen"] == "as_given"


def test_what_the_callers_check_raises_ends_the_search(small, tmp_path, recorded_runs) -> None:
    path, calibration, evaluation = small

    def should_cancel() -> bool:  # raises once the second candidate has started
        if len(recorded_runs) >= 2:
            raise TimeLimit()
        return False

    with pytest.raises(TimeLimit):
        quantize_auto(path, calibration, evaluation, auto_config(), tmp_path / "out", should_cancel=should_cancel)
    assert [name for name, _, _ in recorded_runs] == ["as_given", "minmax"]


def test_the_job_fails_only_when_no_candidate_produced_a_model(small, tmp_path, monkeypatch) -> None:
    path, calibration, evaluation = small

    def run(self, config, name, should_cancel, report):
        raise UnsupportedModelError(f"{name} broke")

    monkeypatch.setattr(Search, "run", run)
    with pytest.raises(UnsupportedModelError, match=r"no candidate produced a model.*as_given broke.*minmax broke"):
        quantize_auto(path, calibration, evaluation, auto_config("minmax"), tmp_path / "out")


def test_a_budget_below_any_run_stops_the_first_candidate_and_runs_the_config_as_given(
    small, tmp_path, monkeypatch, recorded_runs
) -> None:
    path, calibration, evaluation = small
    monkeypatch.setattr(quantcore.config.auto, "AUTO_BUDGET_SECONDS", (1e-3, 86_400.0))  # a budget smaller than any run
    config = replace(auto_config(budget_seconds=1e-3), analysis=AnalysisOptions())
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out")
    section = result.report["auto"]
    assert [name for name, _, _ in recorded_runs] == ["as_given"]
    (first,) = section["candidates"]
    assert first["name"] == "as_given" and first["error"] == search_module.BUDGET_SPENT and first["value"] is None
    assert "ran out during as_given: not tried: minmax, mse, kl" in section["stopped"]
    assert section["chosen"] == "as_given" and not section["met"] and "unscored" in section["reason"]
    final = result.report["config"]
    assert final["observer"] == "percentile" and final["strategy"] == "fixed"  # the final run: the config as given
    assert not final["analysis"]["enabled"] and result.report["analysis"] is None  # ... without its analysis
    assert "without the analysis" in section["reason"]


def test_a_budget_the_first_candidate_cannot_fit_with_its_final_run_is_kept(small, tmp_path, progress) -> None:
    """On the ``progress`` clock, a budget of the config as given's own candidate seconds T: that candidate and
    the final run after it cannot both fit, so it is stopped (said so) and the config as given runs unscored.
    The job, counted by the report's own seconds (the search's, then the final run's stages), ends inside
    the budget, which running the first candidate whole (T, then the final run's stages) would pass."""
    path, calibration, evaluation = small
    free = quantize_auto(path, calibration, evaluation, auto_config("minmax"), tmp_path / "free", progress=progress)
    budget = free.report["auto"]["candidates"][0]["seconds"]
    config = auto_config("minmax", budget_seconds=budget)
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out", progress=progress)
    section = result.report["auto"]
    final = sum(result.report["stage_seconds"].values())
    assert final > 0  # so the first candidate run whole (T) and then the final run end past the budget
    assert [c["error"] for c in section["candidates"]] == [search_module.BUDGET_SPENT]
    assert "ran out during as_given: not tried: minmax" in section["stopped"] and "unscored" in section["reason"]
    assert section["seconds"] + final <= budget


def test_the_budget_stops_a_candidate_inside(small, tmp_path, monkeypatch) -> None:
    """A deadline passed during a candidate cancels it at its next poll, recorded as stopped, not failed."""
    path, calibration, evaluation = small
    original = Search.run
    clock = {"now": 0.0}
    monkeypatch.setattr(search_module.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(quantcore.auto.time, "perf_counter", lambda: clock["now"])

    def run(self, config, name, should_cancel, report):
        if name == "minmax":
            clock["now"] = 1e6  # the budget runs out while this candidate runs
        return original(self, config, name, should_cancel, report)

    monkeypatch.setattr(Search, "run", run)
    result = quantize_auto(path, calibration, evaluation, auto_config("minmax", "mse"), tmp_path / "out")
    section = result.report["auto"]
    assert [c["name"] for c in section["candidates"]] == ["as_given", "minmax"]
    assert section["candidates"][1]["error"] == search_module.BUDGET_SPENT
    assert section["stopped"].endswith("ran out during minmax: not tried: mse") and section["chosen"] == "as_given"


def test_cancel_stops_the_search(small, tmp_path, recorded_runs) -> None:
    path, calibration, evaluation = small
    polls = []

    def should_cancel() -> bool:  # True once the second candidate has started
        polls.append(len(recorded_runs))
        return len(recorded_runs) >= 2

    with pytest.raises(Canceled):
        quantize_auto(path, calibration, evaluation, auto_config(), tmp_path / "out", should_cancel=should_cancel)
    assert [name for name, _, _ in recorded_runs] == ["as_given", "minmax"]
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".auto-")]


def test_an_unreachable_objective_falls_back_to_the_accuracy_target(small, tmp_path) -> None:
    path, calibration, evaluation = small
    config = auto_config("minmax", objective=AccuracyTarget("cosine", 0.99999999))
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out")
    section = result.report["auto"]
    assert not any(c["met"] for c in section["candidates"])
    fallback = section["fallback"]
    assert fallback["error"] is None and fallback["from"] == section["chosen"] and fallback["float_layers"]
    assert "accuracy-target method" in section["reason"] and section["met"] == fallback["met"]
    excluded = result.report["config"]["exclude_node_patterns"]
    assert all(any(layer in p for p in excluded) for layer in fallback["float_layers"])
    assert result.report["config"]["target"] is None  # the final run never chooses on the evaluation data


def test_the_fallback_starts_only_where_its_run_and_the_final_run_fit(small, tmp_path, progress) -> None:
    """On the ``progress`` clock: with an unreachable objective and a budget of the only candidate's seconds T
    plus its final run's estimate F plus T/2, the time left after the search holds F but not the fallback's
    run (at least T) before it: the fallback is not started, and the reason says the budget left no time."""
    path, calibration, evaluation = small
    unreachable = AccuracyTarget("cosine", 0.99999999)
    config = auto_config("as_given", objective=unreachable)
    free = quantize_auto(path, calibration, evaluation, config, tmp_path / "free", progress=progress).report["auto"]
    assert free["fallback"] is not None  # unbounded, it starts
    first = free["candidates"][0]
    budget = first["seconds"] + first["final_seconds"] + first["seconds"] / 2
    config = auto_config("as_given", objective=unreachable, budget_seconds=budget)
    section = quantize_auto(path, calibration, evaluation, config, tmp_path / "out", progress=progress).report["auto"]
    assert section["fallback"] is None
    assert "the budget left no time for the accuracy-target fallback" in section["reason"]


def test_strategy_fixed_never_enters_the_search(small, tmp_path, monkeypatch) -> None:
    path, calibration, evaluation = small

    def entered(*args, **kwargs):
        raise AssertionError("the auto search ran for strategy fixed")

    monkeypatch.setattr(search_module, "run_candidates", entered)
    monkeypatch.setattr(quantcore.auto, "run_candidates", entered)
    config = QuantizeConfig(analysis=NO_ANALYSIS, cpu_latency=False)
    result = quantize(path, calibration, evaluation, config, tmp_path / "out")
    assert result.report["auto"] is None and result.report["config"]["strategy"] == "fixed"
    assert "auto" not in result.report["stage_seconds"]
    with pytest.raises(ValueError, match="quantize_auto"):
        quantize(path, calibration, evaluation, auto_config(), tmp_path / "out")
    with pytest.raises(ValueError, match="strategy 'auto'"):
        quantize_auto(path, calibration, evaluation, config, tmp_path / "out")


def test_a_candidate_whose_method_finds_nothing_to_change_is_skipped_without_a_run(
    small, tmp_path, recorded_runs
) -> None:
    # Conv → Relu → Flatten → Gemm: no two layers joined by an activation alone, so equalization has no pair
    # (its run would be the config as given again); the Conv's bias can be corrected, the Gemm's input smoothed
    path, calibration, evaluation = small
    config = auto_config("equalization", "bias_correction", "smoothquant")
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out")
    assert [name for name, _, _ in recorded_runs] == ["as_given", "bias_correction", "smoothquant"]
    skipped = {c["name"]: c for c in result.report["auto"]["candidates"]}["equalization"]
    assert skipped["error"].startswith("skipped: no pair of layers to equalize")
    assert skipped["seconds"] == 0.0 and skipped["value"] is None and not skipped["pareto"]


def test_a_check_that_raises_leaves_the_candidate_to_its_own_run(small, tmp_path, recorded_runs, monkeypatch) -> None:
    def broken(prepared, config):
        raise ValueError("check broke")

    varied = tuple(replace(c, unchanged=broken) if c.name == "equalization" else c for c in CANDIDATES)
    monkeypatch.setattr(candidates_module, "CANDIDATES", varied)
    path, calibration, evaluation = small
    quantize_auto(path, calibration, evaluation, auto_config("equalization"), tmp_path / "out")
    assert [name for name, _, _ in recorded_runs] == ["as_given", "equalization"]  # run, not skipped


def test_equalization_is_tried_where_the_model_has_a_pair(tmp_path, recorded_runs) -> None:
    rng = np.random.default_rng(0)
    path = save(planted_outlier(), tmp_path / "m.onnx")  # conv1 → Relu → conv2 → Relu → conv3
    data = rng.normal(size=(56, 3, 8, 8)).astype(np.float32)
    quantize_auto(path, {"input": data[:40]}, {"input": data[40:]}, auto_config("equalization"), tmp_path / "out")
    assert [name for name, _, _ in recorded_runs] == ["as_given", "equalization"]


def test_what_each_method_finds_in_a_graph_of_matmuls() -> None:
    # x (N, 4) → MatMul W (4, 3) → Add b → y: the layout of a transformer's projections, no Conv or Gemm
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.ones(shape, np.float32), name) for name, shape in (("w", (4, 3)), ("b", (3,)))],
    )
    prepared = prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    config = QuantizeConfig(platform="tensorrt")
    found = {c.name: c.unchanged(prepared, config) for c in CANDIDATES if c.unchanged is not None}
    assert found == {
        "equalization": "no pair of layers to equalize",
        "bias_correction": "no Conv/Gemm with a bias to correct",
        "smoothquant": None,  # a MatMul reading x through its own weight: whether x has outliers, the data tells
    }


def test_bias_correction_is_skipped_where_the_weights_are_already_on_their_grids() -> None:
    # weights exported from an int8 model: q · 2^-7 with |q| reaching 127 in every output channel, which the
    # per-channel int8 grid of max|W| / 127 reproduces exactly, so no layer's output mean can shift
    model = conv_relu_gemm()
    rng = np.random.default_rng(0)
    for initializer in model.graph.initializer:
        if initializer.name in ("w", "fc.w"):
            codes = rng.integers(-127, 128, size=tuple(initializer.dims)).reshape(initializer.dims[0], -1)
            codes[:, 0] = 127
            snapped = (codes * 2.0**-7).reshape(tuple(initializer.dims)).astype(np.float32)
            initializer.CopyFrom(numpy_helper.from_array(snapped, initializer.name))
    bias_correction = next(c for c in CANDIDATES if c.name == "bias_correction")
    config = QuantizeConfig(platform="tensorrt")
    assert bias_correction.unchanged(prepare(model), config) == (
        "the Conv/Gemm weights are already on their quantization grids, no mean shift to correct"
    )
    assert bias_correction.unchanged(prepare(conv_relu_gemm()), config) is None


def test_full_weights_is_a_candidate_only_where_the_cpu_chose_7_bit_weights(monkeypatch) -> None:
    # the CPU is the one fact here that cannot be chosen: its flags stand in for an x86 CPU with or without VNNI
    full_weights = next(c for c in CANDIDATES if c.name == "full_weights")
    ort = QuantizeConfig(platform="onnxruntime", strategy="auto")
    monkeypatch.setattr(cpu_features, "is_x86", lambda: True)
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert full_weights.applied(ort) == replace(ort, strategy="fixed", reduce_range="off")
    assert full_weights.applied(replace(ort, platform="onnxruntime-dynamic")).reduce_range == "off"
    assert full_weights.applied(replace(ort, reduce_range="on")) is None  # the user's own 7-bit grid
    assert full_weights.applied(replace(ort, reduce_range="off")) is None  # full already
    assert full_weights.applied(QuantizeConfig(platform="tensorrt", strategy="auto")) is None  # no u8s8 kernels
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    assert full_weights.applied(ort) is None  # VNNI: auto keeps full int8 weights itself


def test_the_search_keeps_full_weights_where_7_bit_ones_cost_accuracy_and_builds_on_them(
    heavy_tailed, tmp_path
) -> None:
    """On a CPU without VNNI the config as given runs 7-bit weights; on this Gemm the full int8 candidate is
    better beyond the paired interval (``heavy_tailed``). Kept, it is the base the next candidate varies."""
    path, calibration, evaluation, ranges = heavy_tailed
    config = replace(auto_config("full_weights", "minmax"), platform="onnxruntime", percentile_candidates=())
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out")
    assert ranges == {"as_given": "auto", "full_weights": "off", "minmax": "off"}
    as_given, full, minmax = result.report["auto"]["candidates"]
    assert result.report["auto"]["chosen"] in ("full_weights", "minmax"), (as_given["value"], full["value"])
    assert as_given["difference"]["high"] < 0  # behind the chosen one beyond the interval
    assert minmax["change"] == "activation observer minmax, with full_weights"
    assert result.report["config"]["reduce_range"] == "off"


def test_a_full_weights_run_the_parity_check_re_exported_on_7_bit_weights_is_not_scored(
    heavy_tailed, tmp_path, monkeypatch
):
    """Where the deployed full-range model disagrees with exact Q/DQ, the parity check re-exports it with
    7-bit weights (``quantcore.evaluate.parity.remedy``; stood in for here: whether 16 selection samples
    trip its tolerance is the data's call): the candidate's model is then the config as given's grid, so it
    is not scored as full weights, nor kept as the base."""
    path, calibration, evaluation, ranges = heavy_tailed
    run = Search.run  # the fixture's recorder

    def remedied(self, config, name, should_cancel, report):
        result = run(self, config, name, should_cancel, report)
        if config.reduce_range == "off":
            result["config"] = {**result["config"], "reduce_range": "on"}
            result["parity"] = {**result["parity"], "remedy": "re-exported with 7-bit weights [-64, 63]"}
        return result

    monkeypatch.setattr(Search, "run", remedied)
    config = replace(auto_config("full_weights", "minmax"), platform="onnxruntime", percentile_candidates=())
    result = quantize_auto(path, calibration, evaluation, config, tmp_path / "out")
    _, full, minmax = result.report["auto"]["candidates"]
    assert full["error"] == f"{REMEDIED}: re-exported with 7-bit weights [-64, 63]" and full["value"] is None
    assert ranges == {"as_given": "auto", "full_weights": "off", "minmax": "auto"}  # not the base
    assert minmax["change"] == "activation observer minmax" and result.report["auto"]["chosen"] != "full_weights"
