"""The clipping chosen on the calibration data: one calibration pass gives every candidate (percentiles, and
the MSE threshold read from the same histograms), the choice is the candidate whose exact Q/DQ outputs
are closest to FP32, and the run goes on with it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from quantcore import QuantizeConfig, annotate, calibrate, prepare, quantize
from quantcore.calibrate.calibration import calibrate_clips
from quantcore.calibrate.clip_search import MIN_SAMPLES, SEARCH_SAMPLES, choose_clip
from quantcore.runtime.batching import Batches, input_specs
from tests.quantcore.models import conv_bn_residual, save


@pytest.fixture(scope="module")
def setup():
    prepared = prepare(conv_bn_residual(seed=2))
    x = np.random.default_rng(0).standard_t(3, size=(40, 3, 8, 8)).astype(np.float32)  # heavy tails
    return prepared, x


def test_one_pass_gives_the_configured_percentile_and_the_others(setup) -> None:
    prepared, x = setup
    config = QuantizeConfig(batch_size=8)
    annotation = annotate(prepared, config)
    candidates = calibrate_clips(prepared, annotation, {"input": x}, config, (99.9, 100.0, "mse", 99.99))
    assert list(candidates) == [99.99, 99.9, 100.0, "mse"]  # the configured one first, each once
    alone = calibrate(prepared, annotation, {"input": x}, config)
    minmax = QuantizeConfig(batch_size=8, observer="minmax")
    maxima = calibrate(prepared, annotate(prepared, minmax), {"input": x}, minmax)
    for name in annotation.activations:
        assert np.array_equal(candidates[99.99].configs[name].scale, alone.configs[name].scale), name
        # the 100th percentile of |x| is its maximum, as the minmax observer finds it
        assert np.array_equal(candidates[100.0].configs[name].scale, maxima.configs[name].scale), name
        assert candidates[99.9].configs[name].scale <= candidates[99.99].configs[name].scale, name
    assert any(candidates[99.9].configs[n].scale < alone.configs[n].scale for n in annotation.activations)
    # the MSE candidate is what a run configured with clip="mse" calibrates (re-calibrations give it again)
    mse = calibrate(prepared, annotation, {"input": x}, replace(config, clip="mse"))
    for name in annotation.activations:
        assert np.array_equal(candidates["mse"].configs[name].scale, mse.configs[name].scale), name
    assert any(mse.configs[n].scale != alone.configs[n].scale for n in annotation.activations)


def test_the_candidate_closest_to_fp32_is_kept_and_a_tie_keeps_the_configured_one(setup) -> None:
    prepared, x = setup
    config = QuantizeConfig(batch_size=8)
    annotation = annotate(prepared, config)
    calibrated = calibrate(prepared, annotation, {"input": x}, config)
    first = annotation.activations[0]
    coarse = calibrated.configs[first].with_scale(
        calibrated.configs[first].scale * 1000, calibrated.configs[first].offset
    )
    ruined = calibrated.with_configs({**calibrated.configs, first: coarse})
    batches = Batches({"input": x}, input_specs(prepared.model), 8, what="calibration")
    choice = choose_clip(prepared, {99.99: ruined, 100.0: calibrated}, batches, config)
    assert choice.clip == choice.percentile == 100.0 and choice.annotation is calibrated
    assert choice.scores[100.0] > choice.scores[99.99] + 10  # a 1000x step erases the first activation
    assert choice.samples == min(SEARCH_SAMPLES, 40)
    tie = choose_clip(prepared, {100.0: calibrated, 99.99: calibrated}, batches, config)
    assert tie.percentile == 99.99 and tie.scores[100.0] == tie.scores[99.99]
    mse = choose_clip(prepared, {99.99: ruined, "mse": calibrated}, batches, config)
    assert mse.clip == "mse" and mse.percentile == 99.99  # the histograms' percentile stays the configured one
    assert mse.applied(config) == replace(config, clip="mse")
    assert mse.to_dict()["clip"] == "mse" and mse.to_dict()["chosen"] == 99.99
    assert [(c["clip"], c["percentile"]) for c in mse.to_dict()["candidates"]] == [("percentile", 99.99), ("mse", None)]
    assert "mse threshold kept" in mse.statement


def test_the_run_goes_on_with_the_percentile_chosen_on_the_calibration_data(tmp_path) -> None:
    x = np.random.default_rng(1).standard_t(3, size=(96, 3, 8, 8)).astype(np.float32)
    path = save(conv_bn_residual(seed=2), tmp_path / "m.onnx")
    config = QuantizeConfig(batch_size=8, cpu_latency=False)
    runs = [
        quantize(path, {"input": x[:MIN_SAMPLES]}, {"input": evaluation}, config, tmp_path / str(i))
        for i, evaluation in enumerate((x[MIN_SAMPLES:], -x[MIN_SAMPLES:]))
    ]
    searches = [run.report["calibration"]["percentile_search"] for run in runs]
    assert searches[0] == searches[1]  # chosen on calibration samples: the evaluation data changes nothing
    search = searches[0]
    assert [c["percentile"] for c in search["candidates"]] == [99.9, 99.99, 99.999, 100.0, None]
    assert [c["clip"] for c in search["candidates"]] == ["percentile"] * 4 + ["mse"]
    best = max(search["candidates"], key=lambda c: c["sqnr_db"] if c["sqnr_db"] is not None else math.inf)
    assert search["clip"] == best["clip"] == runs[0].report["config"]["clip"]
    assert search["chosen"] == (best["percentile"] or 99.99) == runs[0].report["config"]["percentile"]
    assert "clip" in runs[0].report["stage_seconds"]
    assert search["samples"] == SEARCH_SAMPLES
    off = QuantizeConfig(percentile_candidates=(), cpu_latency=False)
    few = x[: MIN_SAMPLES - 1]  # one sample short of what a choice needs
    for calibration, chosen_by in (({"input": x[:MIN_SAMPLES]}, off), ({"input": few}, config)):
        run = quantize(path, calibration, {"input": x[MIN_SAMPLES:]}, chosen_by, tmp_path / "off")
        assert run.report["calibration"]["percentile_search"] is None and "clip" not in run.report["stage_seconds"]
        assert run.report["config"]["percentile"] == 99.99


def test_a_run_that_keeps_the_mse_threshold_goes_on_with_it_when_resumed(tmp_path) -> None:
    # On this draw the MSE threshold reproduces FP32 best on the search samples (23.4 dB against 23.3 for
    # 99.999 and 100, 21.4 for the configured 99.99)
    x = np.random.default_rng(3).standard_t(3, size=(96, 3, 8, 8)).astype(np.float32)
    path = save(conv_bn_residual(seed=2), tmp_path / "m.onnx")
    config = QuantizeConfig(batch_size=8, cpu_latency=False)
    data = ({"input": x[:MIN_SAMPLES]}, {"input": x[MIN_SAMPLES:]})
    first = quantize(path, *data, config, tmp_path / "first")
    search = first.report["calibration"]["percentile_search"]
    assert search["clip"] == first.report["config"]["clip"] == "mse"
    assert search["chosen"] == first.report["config"]["percentile"] == 99.99
    resumed = quantize(path, *data, config, tmp_path / "resumed", resume_from=tmp_path / "first")
    assert resumed.report["resumed"] == ["calibrate", "clip", "export"]
    assert resumed.report["config"]["clip"] == "mse" and resumed.report["calibration"]["percentile_search"] == search
    assert resumed.model_path.read_bytes() == first.model_path.read_bytes()
