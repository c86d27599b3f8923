"""The layer-wise runs held to ``AnalysisOptions.layerwise_seconds`` on the clock (``quantcore.analysis.ranking``),
not only as priced: on a clock that only the runs move, each costing a fixed number of seconds, so that
nothing here depends on how fast the machine is."""

from __future__ import annotations

import dataclasses
from collections import Counter
from types import SimpleNamespace

import pytest

from quantcore import QuantizeConfig
from quantcore.analysis import cones as cones_module
from quantcore.analysis import ranking as ranking_module
from quantcore.analysis.ranking import analyze
from quantcore.analysis.switch import switchable_model
from quantcore.config import AnalysisOptions
from tests.quantcore.test_analysis import planted_case

# 32 evaluation samples in 4 batches of 8; the planted model has 4 layers, too few for cones: one group
CONFIG = QuantizeConfig(platform="tensorrt", cpu_latency=False, batch_size=8)
RUN_SECONDS = 1.0
PRICED_SECONDS = 0.01  # a whole run on one sample as priced: the pricing misses the runs' cost by far


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_case(tmp_path_factory, CONFIG)


@pytest.fixture
def run_clock(monkeypatch):
    """``time.perf_counter`` reads a clock that only the layer-wise runs move: each reference run and each
    layer's run takes ``RUN_SECONDS``; the runs are priced at ``PRICED_SECONDS`` a whole run on one sample
    (the pricing's own runs, on cones where there are any, leave the clock as it was). ``layer_runs`` counts
    the runs of each layer (flag index), ``opened`` the groups whose runs were opened."""

    clock = SimpleNamespace(now=0.0, layer_runs=Counter(), opened=[], pricing=False)
    reference, quantized = cones_module.GroupRuns.reference, cones_module.GroupRuns.quantized
    price, group = cones_module.LayerRuns.price, cones_module.LayerRuns.group

    def timed_reference(self, batch):
        clock.now += RUN_SECONDS
        return reference(self, batch)

    def timed_quantized(self, k, batch, values):
        clock.now += RUN_SECONDS
        clock.layer_runs[k] += 1
        return quantized(self, k, batch, values)

    def priced(self, sample, *, cones=True):
        now, layer_runs, clock.pricing = clock.now, clock.layer_runs.copy(), True
        try:
            found = price(self, sample, cones=cones)
        finally:
            clock.now, clock.layer_runs, clock.pricing = now, layer_runs, False
        return dataclasses.replace(found, reference_seconds=PRICED_SECONDS, cone_seconds={})

    def counted(self, cone):
        if not clock.pricing:
            clock.opened.append(cone)
        return group(self, cone)

    monkeypatch.setattr(ranking_module.time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(cones_module.GroupRuns, "reference", timed_reference)
    monkeypatch.setattr(cones_module.GroupRuns, "quantized", timed_quantized)
    monkeypatch.setattr(cones_module.LayerRuns, "price", priced)
    monkeypatch.setattr(cones_module.LayerRuns, "group", counted)
    return clock


def test_layerwise_runs_stop_on_the_clock_at_their_bound(planted, run_clock) -> None:
    """Priced at 0.05 s a sample over the reference and 4 layers, all 32 samples fit 12 s: 4 batches of 5
    runs, 20 s on this clock. The runs stop when the next would pass 12 s: 2 whole batches (10 s), then the
    third batch's reference run and its most harmful layer's run; what was measured is kept and stated.
    Before, every run ran: the clock stood at 20 s."""
    prepared, calibrated, evaluation = planted
    report = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=12.0))
    assert run_clock.now == 12.0  # within the bound, and no run left out that would have fit
    # the layer of lowest local SQNR at its inputs runs first in each batch: it alone gets the third batch
    layers = switchable_model(prepared, calibrated).layers
    worst = min(report["layers"], key=lambda row: row["local_sqnr_db"])["node"]
    assert sorted(run_clock.layer_runs.values()) == [2, 2, 2, 3]
    assert [layers[k].node for k, runs in run_clock.layer_runs.items() if runs == 3] == [worst]
    layerwise = report["layerwise"]
    assert layerwise["samples"] == 24 and layerwise["layers_analyzed"] == 4 and layerwise["runs_per_batch"] == 5
    assert all(row["analyzed"] and row["sqnr_db"] is not None for row in report["layers"])
    statement = layerwise["statement"]
    assert "on the first 24 evaluation samples for 1 of 4 layers and on the first 16 for 3 more" in statement
    assert "held to 12 s as priced on the first sample (0.01 s a whole run)" in statement
    assert "on the clock: stopped after 12 of 20 runs" in statement


def test_a_later_group_is_not_opened_past_the_bound(planted, run_clock, monkeypatch) -> None:
    """One layer a cone group (4 groups): after the first group's 4 batches (8 s) the second group's first
    batch (a reference and a layer run, 2 s) does not fit 9 s, so no other group's session is opened; the
    figures of the layer measured are those of its run without a bound."""
    monkeypatch.setattr(cones_module, "groups_for", lambda layers: layers)
    prepared, calibrated, evaluation = planted
    free = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=None))
    assert len(run_clock.opened) == 4
    run_clock.now, run_clock.layer_runs, run_clock.opened = 0.0, Counter(), []
    held = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=9.0))
    assert run_clock.now == 8.0 and len(run_clock.opened) == 1 and list(run_clock.layer_runs.values()) == [4]
    layerwise = held["layerwise"]
    assert layerwise["layers_analyzed"] == 1 and layerwise["runs_per_batch"] == 2 and layerwise["samples"] == 32
    assert "for 1 of 4 layers (those with the lowest local SQNR at their inputs first)" in layerwise["statement"]
    assert "stopped after 8 of 32 runs" in layerwise["statement"]
    (measured,) = [row for row in held["layers"] if row["analyzed"]]
    assert measured["node"] == min(held["layers"], key=lambda row: row["local_sqnr_db"])["node"]  # its group first
    same = next(row for row in free["layers"] if row["node"] == measured["node"])
    assert (measured["sqnr_db"], measured["cosine"]) == (same["sqnr_db"], same["cosine"])  # the same runs


def test_a_bound_not_reached_changes_no_figure(planted, run_clock) -> None:
    """20 s of runs under a 100 s bound: every run runs, and the report is the unbounded one's to the bit but
    for the bounds it states."""
    prepared, calibrated, evaluation = planted
    free = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=None))
    assert run_clock.now == 20.0
    run_clock.now = 0.0
    bounded = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=100.0))
    assert run_clock.now == 20.0
    assert bounded["layers"] == free["layers"] and bounded["tensors"] == free["tensors"]
    for key in ("samples", "layers_analyzed", "runs_per_batch", "statement"):
        assert bounded["layerwise"][key] == free["layerwise"][key], key
    assert "held" not in bounded["layerwise"]["statement"]
