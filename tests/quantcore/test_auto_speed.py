"""The choice among candidates that meet the objective where the deployment favours latency
(quantcore.auto.speed): the rule with times a test chooses (``FakeTimer``: the CPU's timings cannot be made
to differ on demand), then the whole search with real timings of real candidate models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from jobs.report_schema import Report
from quantcore import QuantizeConfig, quantize_auto
from quantcore.auto.budget import FinalRun
from quantcore.auto.scoring import SampleSums
from quantcore.auto.search import Search, Tried
from quantcore.auto.selection import SelectionSplit
from quantcore.auto.speed import faster_meeting
from quantcore.evaluate.paired_latency import Timing, compare
from quantcore.progress import Monitor
from quantcore.runtime import cpu_features
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
    a refusal message; counts its calls."""

    def __init__(self, *per_model: list[float] | str) -> None:
        self.per_model = per_model
        self.calls = 0

    def __call__(self, models, batch_sizes):
        self.calls += 1
        assert len(models) == len(self.per_model)
        return {b: [t if isinstance(t, str) else list(t) for t in self.per_model] for b in batch_sizes}


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


def tried(name: str, cosines: list[float], model: str, latency: float | None = 1.0, final: float = 1.0) -> Tried:
    value = float(np.mean(cosines))  # unit norms: the sums' cosine is near the mean for close values
    sums = cosine_sums(cosines)
    return Tried(name, name, LATENCY, value, value >= 0.99, 1000, latency, 1.0, None, sums, final, model_path=model)


def test_a_clearly_faster_candidate_that_meets_the_objective_replaces_the_most_accurate(search, tmp_path):
    a, b = graphs(tmp_path)
    kept, fast = tried("full_weights", [0.999] * 16, a), tried("as_given", [0.995] * 16, b)
    timer = FakeTimer([6.0, 6.1, 6.2, 5.9], [10.0, 10.2, 10.4, 9.9])  # in the candidates' order
    choice = faster_meeting(search, [fast, kept], kept, LATENCY, 600.0, timer)
    assert choice.kept is fast and timer.calls == 1
    entry = choice.entry
    assert [row["name"] for row in entry["compared"]] == ["as_given", "full_weights"]
    assert entry["batch_sizes"] == [1, 32]
    assert entry["compared"][0]["timings"]["batch_32"]["p50_ms"] == pytest.approx(6.05)
    assert entry["verdict"].startswith("as_given kept over the more accurate full_weights")
    # within the spread, or slower: the most accurate stays
    for times in ([9.8, 10.1, 10.5, 10.0], [14.0, 15.0, 14.5, 14.2]):
        choice = faster_meeting(search, [fast, kept], kept, LATENCY, 600.0, FakeTimer(times, [10.0, 10.2, 10.4, 9.9]))
        assert choice.kept is kept and "none of the others" in choice.entry["verdict"]


def test_only_candidates_that_meet_the_objective_across_the_interval_are_timed(search, tmp_path):
    """0.991 on average but 0.95 on two of 16 samples: another draw of samples could fall under 0.99."""
    a, b = graphs(tmp_path)
    kept = tried("full_weights", [0.999] * 16, a)
    marginal = tried("as_given", [0.9995] * 14 + [0.95] * 2, b)
    assert marginal.met
    timer = FakeTimer()
    choice = faster_meeting(search, [marginal, kept], kept, LATENCY, 600.0, timer)
    assert choice.kept is kept and timer.calls == 0
    assert choice.entry["verdict"] == "not timed: no other candidate meets the objective across its interval"


def test_one_model_per_graph_is_timed_the_most_accurate_standing_for_the_rest(search, tmp_path):
    a, b = graphs(tmp_path)
    kept = tried("full_weights", [0.999] * 16, a)
    same = tried("minmax", [0.998] * 16, a)  # the graph of the kept one: its speed
    others = [tried("as_given", [0.995] * 16, b), tried("mse", [0.997] * 16, b)]
    timer = FakeTimer([6.0, 6.1, 6.2, 5.9], [10.0, 10.2, 10.4, 9.9])
    choice = faster_meeting(search, [*others, kept, same], kept, LATENCY, 600.0, timer)
    assert choice.kept is others[1]  # mse: the more accurate of graph b
    assert [(r["name"], r["stands_for"]) for r in choice.entry["compared"]] == [
        ("mse", ["as_given"]),
        ("full_weights", ["minmax"]),
    ]
    alone = faster_meeting(search, [kept, same], kept, LATENCY, 600.0, timer)
    assert alone.kept is kept and timer.calls == 1 and "deploys the same graph" in alone.entry["verdict"]


def test_a_model_onnx_runtime_refuses_to_time_is_not_kept(search, tmp_path):
    a, b = graphs(tmp_path)
    kept, other = tried("full_weights", [0.999] * 16, a), tried("as_given", [0.995] * 16, b)
    choice = faster_meeting(search, [other, kept], kept, LATENCY, 600.0, FakeTimer("NOT_IMPLEMENTED: ...", [9.0] * 4))
    assert choice.kept is kept and choice.entry["compared"][0] == {
        "name": "as_given",
        "stands_for": [],
        "timings": {},
        "error": "NOT_IMPLEMENTED: ...",
    }


def test_nothing_is_timed_where_it_does_not_fit_or_cannot_matter(search, tmp_path):
    a, b = graphs(tmp_path)
    kept, other = tried("full_weights", [0.999] * 16, a), tried("as_given", [0.995] * 16, b)
    timer = FakeTimer([1.0] * 4, [0.5] * 4)
    # 9 rounds of 2 models at 1 s a sample: 18 s at batch 1 and 576 s at batch 32, more than the 300 s left
    slow = [replace(t, latency_p50_ms=1000.0) for t in (other, kept)]
    choice = faster_meeting(search, slow, slow[1], LATENCY, 300.0, timer)
    assert choice.kept is slow[1] and choice.entry["verdict"].startswith("not timed: 594.0 s of timing runs")
    unmeasured = replace(other, latency_p50_ms=None)
    choice = faster_meeting(search, [unmeasured, kept], kept, LATENCY, 600.0, timer)
    assert choice.entry["verdict"] == "not timed: the candidates' latency was not measured"
    # no latency objective, or the kept one does not meet the objective: no speed entry at all
    accuracy = replace(LATENCY, cpu_objective="accuracy")
    assert faster_meeting(search, [other, kept], kept, accuracy, 600.0, timer).entry is None
    missed = replace(kept, met=False)
    assert faster_meeting(search, [other, missed], missed, LATENCY, 600.0, timer).entry is None
    assert timer.calls == 0


def test_the_search_times_real_candidates_and_keeps_the_one_the_timings_favour(tmp_path, monkeypatch) -> None:
    """On a CPU without VNNI (the flags stand in for one: the CPU is what a test cannot choose), full int8
    weights are deployed as uint8, a graph of its own. The heavy-tailed Gemm of
    test_the_search_keeps_full_weights_where_7_bit_ones_cost_accuracy_and_builds_on_them makes them the more
    accurate, the config as given meeting the objective too: the search times the two graphs on this CPU,
    and the report's choice is the one its timings give."""
    monkeypatch.setattr(cpu_features, "is_x86", lambda: True)
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(16, 64)).astype(np.float32)
    weight[np.arange(16), rng.integers(0, 64, 16)] = 20.0
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w"], ["output"], transB=1)],
        "heavy_tailed_gemm",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(weight, "w")],
    )
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    data = rng.normal(size=(56, 64)).astype(np.float32)
    config = replace(
        auto_config("full_weights", "minmax"),
        platform="onnxruntime",
        percentile_candidates=(),
        cpu_objective="latency",
        cpu_batch_sizes=(1, 8),
        cpu_latency=True,  # each candidate's batch-1 latency: what the timing's cost is estimated from
    )
    report = quantize_auto(path, {"input": data[:40]}, {"input": data[40:]}, config, tmp_path / "out").report
    Report.model_validate(report)
    auto = report["auto"]
    assert all(c["met"] for c in auto["candidates"])  # cosine >= 0.99 at 7 bits and at 8 on this Gemm
    assert auto["candidates"][0]["difference"]["high"] < 0  # the config as given: the less accurate
    speed = auto["speed"]
    compared = {row["name"]: row for row in speed["compared"]}
    # full int8 weights with minmax deploy full_weights' graph; the config as given, 7-bit int8, its own
    assert sorted(compared) in (["as_given", "full_weights"], ["as_given", "minmax"])
    assert sorted(name for row in compared.values() for name in row["stands_for"]) == sorted(
        {"full_weights", "minmax"} - set(compared)
    )
    timings = {
        name: {int(k.removeprefix("batch_")): Timing.from_dict(t) for k, t in row["timings"].items()}
        for name, row in compared.items()
    }
    assert all(set(t) == {1, 8} for t in timings.values()) and speed["batch_sizes"] == [1, 8]
    accurate = next(name for name in compared if name != "as_given")
    faster = compare(timings["as_given"], timings[accurate]) == "faster"
    assert auto["chosen"] == ("as_given" if faster else accurate), speed["verdict"]
    assert report["config"]["reduce_range"] == ("auto" if faster else "off")
    assert speed["verdict"] in auto["reason"]
