"""The clipping percentile chosen on the calibration data: one calibration pass gives every candidate, the
choice is the candidate whose exact Q/DQ outputs are closest to FP32, and the run goes on with it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantcore import QuantizeConfig, annotate, calibrate, prepare, quantize
from quantcore.batching import Batches, input_specs
from quantcore.calibration import calibrate_percentiles
from quantcore.clip_search import MIN_SAMPLES, SEARCH_SAMPLES, choose_percentile
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
    candidates = calibrate_percentiles(prepared, annotation, {"input": x}, config, (99.9, 100.0, 99.99))
    assert list(candidates) == [99.99, 99.9, 100.0]  # the configured one first, each once
    alone = calibrate(prepared, annotation, {"input": x}, config)
    minmax = QuantizeConfig(batch_size=8, observer="minmax")
    maxima = calibrate(prepared, annotate(prepared, minmax), {"input": x}, minmax)
    for name in annotation.activations:
        assert np.array_equal(candidates[99.99].configs[name].scale, alone.configs[name].scale), name
        # the 100th percentile of |x| is its maximum, as the minmax observer finds it
        assert np.array_equal(candidates[100.0].configs[name].scale, maxima.configs[name].scale), name
        assert candidates[99.9].configs[name].scale <= candidates[99.99].configs[name].scale, name
    assert any(candidates[99.9].configs[n].scale < alone.configs[n].scale for n in annotation.activations)


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
    choice = choose_percentile(prepared, {99.99: ruined, 100.0: calibrated}, batches, config)
    assert choice.percentile == 100.0 and choice.annotation is calibrated
    assert choice.scores[100.0] > choice.scores[99.99] + 10  # a 1000x step erases the first activation
    assert choice.samples == min(SEARCH_SAMPLES, 40)
    tie = choose_percentile(prepared, {100.0: calibrated, 99.99: calibrated}, batches, config)
    assert tie.percentile == 99.99 and tie.scores[100.0] == tie.scores[99.99]


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
    assert [c["percentile"] for c in search["candidates"]] == [99.9, 99.99, 99.999, 100.0]
    best = max(search["candidates"], key=lambda c: c["sqnr_db"] if c["sqnr_db"] is not None else math.inf)
    assert search["chosen"] == best["percentile"] == runs[0].report["config"]["percentile"]
    assert "clip" in runs[0].report["stage_seconds"]
    assert search["samples"] == SEARCH_SAMPLES
    off = QuantizeConfig(percentile_candidates=(), cpu_latency=False)
    few = x[: MIN_SAMPLES - 1]  # one sample short of what a choice needs
    for calibration, chosen_by in (({"input": x[:MIN_SAMPLES]}, off), ({"input": few}, config)):
        run = quantize(path, calibration, {"input": x[MIN_SAMPLES:]}, chosen_by, tmp_path / "off")
        assert run.report["calibration"]["percentile_search"] is None and "clip" not in run.report["stage_seconds"]
        assert run.report["config"]["percentile"] == 99.99
