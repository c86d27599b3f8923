"""The search's choices where the deployment favours latency: among candidates that meet the objective
(quantcore.auto.speed) and whether full int8 weights are the base of the later candidates
(quantcore.auto.search): the rules with times a test chooses (``FakeTimer`` in place of
``quantcore.auto.timing.default_timer``: the CPU's timings cannot be made to differ on demand), then the
whole search with real timings of real candidate models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from jobs.report_schema import Report
from quantcore import QuantizeConfig, quantize_auto
from quantcore.auto import timing
from quantcore.auto.budget import FinalRun
from quantcore.auto.search import Search, Tried, pareto_front
from quantcore.auto.selection import SelectionSplit
from quantcore.auto.speed import faster_meeting
from quantcore.evaluate.paired_latency import Timing, compare
from quantcore.numerics.paired_scores import SampleSums
from quantcore.progress import Monitor
from quantcore.runtime.batching import input_specs
from tests.quantcore.auto_cases import auto_config
from tests.quantcore.models import conv_relu_gemm, save

LATENCY = QuantizeConfig(platform="onnxruntime", strategy="auto", cpu_objective="latency", cpu_batch_sizes=(1, 32))


def cosine_sums(cosines: list[float]) -> SampleSums:
    """Per-sample sums of unit-norm outputs whose cosine to FP32's is each of ``cosines``."""
    c = np.asarray(cosines, dtype=np.float64)
    return SampleSums("cosine", {"output": np.stack([c, np.ones_like(c), np.ones_like(c), 2 - 2 * c], axis=1)})


class FakeTimer:
    """Times in ms per model (by its position among the models timed), the same at every batch size, or
    a refusal message; counts its calls. ``install``: in place of the CPU's timer."""

    def __init__(self, *per_model: list[float] | str) -> None:
        self.per_model = per_model
        self.calls = 0

    def __call__(self, models, batch_sizes):
        self.calls += 1
        assert len(models) == len(self.per_model)
        return {b: [t if isinstance(t, str) else list(t) for t in self.per_model] for b in batch_sizes}

    def install(self, monkeypatch) -> FakeTimer:
        monkeypatch.setattr(timing, "default_timer", lambda specs, sample, threads: self)
        return self


@pytest.fixture
def search(tmp_path) -> Search:
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    selection = {"input": np.zeros((16, 2, 6, 6), np.float32)}
    split = SelectionSplit(selection, selection, range(16), range(16, 32))
    final = FinalRun.of(LATENCY, (16, 16), 16)
    return Search(path, input_specs(conv_relu_gemm()), split, None, tmp_path, Monitor(), final)


def graphs(tmp_path) -> tuple[str, str]:
    """Two models of different graphs (two timing signatures)."""
    return save(conv_relu_gemm(), tmp_path / "a.onnx"), save(conv_relu_gemm(transB=0), tmp_path / "b.onnx")


def tried(name: str, cosines: list[float], model: str, latency: float = 1.0, final: float = 1.0) -> Tried:
    value = float(np.mean(cosines))  # unit norms: the sums' cosine is the mean
    sums = cosine_sums(cosines)
    return Tried(
        name,
        name,
        LATENCY,
        value,
        value >= 0.99,
        1000,
        latency,
        1.0,
        None,
        sums,
        final,
        model_path=model,
        sample_seconds=latency / 1000.0,
    )


def test_a_clearly_faster_candidate_that_meets_the_objective_replaces_the_most_accurate(search, tmp_path, monkeypatch):
    a, b = graphs(tmp_path)
    kept, fast = tried("full_weights", [0.999] * 16, a), tried("as_given", [0.995] * 16, b)
    timer = FakeTimer([6.0, 6.1, 6.2, 5.9], [10.0, 10.2, 10.4, 9.9]).install(monkeypatch)  # the candidates' order
    choice = faster_meeting(search, [fast, kept], kept, LATENCY, 600.0)
    assert choice.kept is fast and timer.calls == 2  # batch 1, then batch 32
    entry = choice.entry
    assert [row["name"] for row in entry["compared"]] == ["as_given", "full_weights"]
    assert entry["batch_sizes"] == [1, 32]
    assert entry["compared"][0]["timings"]["batch_32"]["p50_ms"] == pytest.approx(6.05)
    assert entry["verdict"].startswith("as_given kept over the more accurate full_weights")
    assert faster_meeting(search, [fast, kept], kept, LATENCY, 600.0).entry["reused"] and timer.calls == 2
    # within the spread, or slower: the most accurate stays (a new search: nothing timed yet)
    for times in ([9.8, 10.1, 10.5, 10.0], [14.0, 15.0, 14.5, 14.2]):
        FakeTimer(times, [10.0, 10.2, 10.4, 9.9]).install(monkeypatch)
        choice = faster_meeting(replace(search, timed={}), [fast, kept], kept, LATENCY, 600.0)
        assert choice.kept is kept and "none of the others" in choice.entry["verdict"]


def test_only_candidates_that_meet_the_objective_across_the_interval_are_timed(search, tmp_path, monkeypatch):
    """0.991 on average but 0.95 on two of 16 samples: another draw of samples could fall under 0.99."""
    a, b = graphs(tmp_path)
    kept = tried("full_weights", [0.999] * 16, a)
    marginal = tried("as_given", [0.9995] * 14 + [0.95] * 2, b)
    assert marginal.met
    timer = FakeTimer().install(monkeypatch)
    choice = faster_meeting(search, [marginal, kept], kept, LATENCY, 600.0)
    assert choice.kept is kept and timer.calls == 0
    assert choice.entry["verdict"] == "not timed: no other candidate meets the objective across its interval"


def test_one_model_per_graph_is_timed_the_most_accurate_standing_for_the_rest(search, tmp_path, monkeypatch):
    a, b = graphs(tmp_path)
    kept = tried("full_weights", [0.999] * 16, a)
    same = tried("minmax", [0.998] * 16, a)  # the graph of the kept one: its speed
    others = [tried("as_given", [0.995] * 16, b), tried("mse", [0.997] * 16, b)]
    timer = FakeTimer([6.0, 6.1, 6.2, 5.9], [10.0, 10.2, 10.4, 9.9]).install(monkeypatch)
    choice = faster_meeting(search, [*others, kept, same], kept, LATENCY, 600.0)
    assert choice.kept is others[1]  # mse: the more accurate of graph b
    assert [(r["name"], r["stands_for"]) for r in choice.entry["compared"]] == [
        ("mse", ["as_given"]),
        ("full_weights", ["minmax"]),
    ]
    alone = faster_meeting(search, [kept, same], kept, LATENCY, 600.0)
    assert alone.kept is kept and timer.calls == 2 and "deploys the same graph" in alone.entry["verdict"]


def test_a_model_onnx_runtime_refuses_to_time_is_not_kept(search, tmp_path, monkeypatch):
    a, b = graphs(tmp_path)
    kept, other = tried("full_weights", [0.999] * 16, a), tried("as_given", [0.995] * 16, b)
    FakeTimer("NOT_IMPLEMENTED: ...", [9.0] * 4).install(monkeypatch)
    choice = faster_meeting(search, [other, kept], kept, LATENCY, 600.0)
    assert choice.kept is kept and choice.entry["compared"][0] == {
        "name": "as_given",
        "stands_for": [],
        "timings": {},
        "error": "NOT_IMPLEMENTED: ...",
    }


def test_batch_sizes_are_timed_only_where_they_fit(search, tmp_path, monkeypatch):
    a, b = graphs(tmp_path)
    other, kept = (tried(n, [c] * 16, m, latency=1000.0) for n, c, m in (("as_given", 0.995, b), ("full", 0.999, a)))
    # 9 rounds of 2 models at 1 s a sample: 18 s at batch 1, more than the 9 s left once the final run is held back
    timer = FakeTimer([500.0] * 4, [1000.0] * 4).install(monkeypatch)
    choice = faster_meeting(search, [other, kept], kept, LATENCY, 10.0)
    assert choice.kept is kept and timer.calls == 0
    assert choice.entry["verdict"] == (
        "not timed: 18.0 s of timing runs at batch 1 do not fit the 9.0 s left, the final run held back"
    )
    # batch 1 fits; timed at 0.5 and 1 s, batch 32 would take 9 x 32 x 1.5 s
    choice = faster_meeting(search, [other, kept], kept, LATENCY, 300.0)
    assert timer.calls == 1 and choice.entry["batch_sizes"] == [1] and choice.kept is other  # clearly faster at 1
    assert choice.entry["left_out"].startswith("432.0 s of timing runs at batch 32 do not fit the 2")
    assert choice.entry["verdict"].endswith(", the final run held back)")


def test_nothing_is_timed_where_it_cannot_matter(search, tmp_path, monkeypatch):
    a, b = graphs(tmp_path)
    kept, other = tried("full_weights", [0.999] * 16, a), tried("as_given", [0.995] * 16, b)
    timer = FakeTimer([1.0] * 4, [0.5] * 4).install(monkeypatch)
    # no latency objective, or the kept one does not meet the objective: no speed entry at all
    accuracy = replace(LATENCY, cpu_objective="accuracy")
    assert faster_meeting(search, [other, kept], kept, accuracy, 600.0).entry is None
    missed = replace(kept, met=False)
    assert faster_meeting(search, [other, missed], missed, LATENCY, 600.0).entry is None
    assert timer.calls == 0


def latency_config() -> QuantizeConfig:
    """Candidates full_weights and minmax on the ``heavy_tailed`` Gemm, the deployment favouring latency."""
    return replace(
        auto_config("full_weights", "minmax"),
        platform="onnxruntime",
        percentile_candidates=(),
        cpu_objective="latency",
        cpu_batch_sizes=(1, 8),
    )


@pytest.mark.parametrize("full_slower", [True, False])
def test_full_weights_clearly_slower_are_not_the_base_of_the_later_candidates(
    heavy_tailed, tmp_path, monkeypatch, full_slower
):
    """Timed clearly slower than the config as given, full int8 weights stay a candidate of their own: the
    later candidates vary the config as given (7-bit weights), and the faster graph that meets the objective
    is kept. Not slower, they are the base, as where the deployment does not favour latency."""
    path, calibration, evaluation, ranges = heavy_tailed
    full_times = [2.0, 2.1, 2.2, 1.9] if full_slower else [1.0, 1.1, 1.2, 0.9]
    timer = FakeTimer([1.0, 1.1, 1.2, 0.9], full_times).install(monkeypatch)  # as given first: the tried order
    report = quantize_auto(path, calibration, evaluation, latency_config(), tmp_path / "out").report
    Report.model_validate(report)
    as_given, full, minmax = report["auto"]["candidates"]
    assert as_given["met"] and as_given["difference"]["high"] < 0  # met, and behind full_weights beyond noise
    assert timer.calls == 2  # the base's timing at batch 1 and 8, reused by the choice among those that meet it
    assert report["auto"]["speed"]["reused"]
    if full_slower:
        assert ranges == {"as_given": "auto", "full_weights": "off", "minmax": "auto"}
        assert "not the base of the later candidates" in full["change"]
        assert (
            "clearly slower than as_given's (p50 1.05 → 2.05 ms at batch 1, 1.05 → 2.05 ms at batch 8)"
            in (full["change"])
        )
        assert minmax["change"] == "activation observer minmax"
        assert report["auto"]["chosen"] in ("as_given", "minmax") and report["config"]["reduce_range"] == "auto"
        assert report["auto"]["speed"]["verdict"].startswith(f"{report['auto']['chosen']} kept over the more accurate")
    else:
        assert ranges == {"as_given": "auto", "full_weights": "off", "minmax": "off"}
        assert minmax["change"] == "activation observer minmax, with full_weights"
        assert report["auto"]["chosen"] in ("full_weights", "minmax") and report["config"]["reduce_range"] == "off"
        assert "none of the others" in report["auto"]["speed"]["verdict"]
        assert (
            "; the base of the later candidates: not clearly slower than as_given (p50 1.05 → 1.05 ms"
            in (full["change"])
        )


def test_the_search_times_real_candidates_and_keeps_the_one_the_timings_favour(heavy_tailed, tmp_path) -> None:
    """The same search, timed on this CPU: whichever way the timings go, the base and the choice follow them."""
    path, calibration, evaluation, ranges = heavy_tailed
    report = quantize_auto(path, calibration, evaluation, latency_config(), tmp_path / "out").report
    Report.model_validate(report)
    auto = report["auto"]
    assert all(c["met"] for c in auto["candidates"])
    speed = auto["speed"]
    compared = {row["name"]: row for row in speed["compared"]}
    assert len(compared) == 2 and speed["most_accurate"] in compared  # two graphs: 7-bit int8 and uint8 weights
    assert {*compared, *(name for row in compared.values() for name in row["stands_for"])} == set(ranges)
    assert {ranges[name] for name in compared} == {"auto", "off"}
    timings = {
        name: {int(k.removeprefix("batch_")): Timing.from_dict(t) for k, t in row["timings"].items()}
        for name, row in compared.items()
    }
    assert all(set(t) == {1, 8} for t in timings.values()) and speed["batch_sizes"] == [1, 8]
    other = next(name for name in compared if name != speed["most_accurate"])
    faster = compare(timings[other], timings[speed["most_accurate"]]) == "faster"
    assert auto["chosen"] == (other if faster else speed["most_accurate"]), speed["verdict"]
    assert report["config"]["reduce_range"] == ranges[auto["chosen"]]
    assert speed["verdict"] in auto["reason"]


def test_the_pareto_front_counts_latency_where_measured(tmp_path):
    a = graphs(tmp_path)[0]
    accurate, fast, slower = (
        tried("a", [0.999] * 16, a, 2.0),
        tried("b", [0.995] * 16, a, 1.0),
        tried("c", [0.995] * 16, a, 1.5),
    )
    assert pareto_front([accurate, fast, slower], higher_is_better=True) == {"a", "b"}  # c: b is as good and faster
    # b unmeasured: against a, as accurate at most and as small, it is dominated; c is faster than a
    unmeasured = replace(fast, latency_p50_ms=None)
    assert pareto_front([accurate, unmeasured, slower], higher_is_better=True) == {"a", "c"}
