"""Latency-aware placement (quantcore.analysis.placement): regions, decisions from an injected timer (so
the decisions are deterministic; no test here checks a speed), the timing cache, and the pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jobs.report_schema import Report
from quantcore import QuantizeConfig, annotate, calibrate, export, prepare, quantize
from quantcore.analysis import placement
from quantcore.analysis.placement import MAX_ROUNDS, PlacementRun, place
from quantcore.analysis.regions import quantized_regions
from quantcore.config import AnalysisOptions
from quantcore.evaluate.paired_latency import Timing, no_slower
from quantcore.runtime.batching import Batches, input_specs
from tests.quantcore.models import save
from tests.test_report_schema import undocumented

# the options every run here shares: no clip search, analysis or latency stage (they do not concern placement)
FAST = {"platform": "onnxruntime", "percentile_candidates": (), "analysis": AnalysisOptions(enabled=False)}


def two_regions() -> onnx.ModelProto:
    """input (N, 3, 8, 8) → conv1 → relu1 → softmax (float on the CPU EP) → conv2 → relu2 → out.

    Softmax stays float, so the quantized nodes form two regions: {conv1, relu1} and {conv2} (relu2 writes
    the graph's output, read in float: nothing to quantize there)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
        for name, shape in (("w1", (4, 3, 3, 3)), ("b1", (4,)), ("w2", (4, 4, 3, 3)), ("b2", (4,)))
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Softmax", ["r1"], ["s"], name="softmax", axis=1),
        helper.make_node("Conv", ["s", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["out"], name="relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_regions",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 8, 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def data() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(32, 3, 8, 8)).astype(np.float32)


def _reads_dequantized(model: onnx.ModelProto, node_name: str) -> bool:
    producers = {out: node for node in model.graph.node for out in node.output}
    node = next(n for n in model.graph.node if n.name == node_name)
    return any(producers.get(name) is not None and producers[name].op_type == "DequantizeLinear" for name in node.input)


# a noisy machine's runs as multiples of their median: quartiles at 0.8x and 1.4x
SPREAD = (0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.4, 1.6, 2.0)


class FakeTimer:
    """Deterministic times: 1 ms, plus ``penalty`` ms for each node in ``slow`` that reads a dequantized
    tensor (that node's region "runs slower quantized"), or once if any does (``joint``: the nodes' kernels
    lose only together); refuses models with a node in ``refused`` quantized. Every run takes that time,
    or, with ``spread``, that time times each of ``SPREAD``."""

    def __init__(
        self,
        slow: tuple[str, ...] = (),
        penalty: float = 0.5,
        refused: tuple[str, ...] = (),
        *,
        joint: bool = False,
        spread: bool = False,
    ) -> None:
        self.slow, self.penalty, self.refused, self.joint = slow, penalty, refused, joint
        self.factors = SPREAD if spread else (1.0,) * len(SPREAD)
        self.calls = 0

    def __call__(self, models, batch_sizes):
        self.calls += 1
        result = {}
        for batch in batch_sizes:
            times = []
            for serialized in models:
                model = onnx.load_from_string(serialized)
                if any(_reads_dequantized(model, name) for name in self.refused):
                    times.append("QLinearConv: not implemented (injected)")
                    continue
                slow = [_reads_dequantized(model, name) for name in self.slow]
                time = 1.0 + self.penalty * (any(slow) if self.joint else sum(slow))
                times.append([time * factor for factor in self.factors])
            result[batch] = times
        return result


def _placement_run(
    tmp_path: Path, data: np.ndarray, config: QuantizeConfig, model: onnx.ModelProto | None = None
) -> PlacementRun:
    path = save(model or two_regions(), tmp_path / "model.onnx")
    prepared = prepare(path)
    base = annotate(prepared, config)
    calibrated = calibrate(prepared, base, {"input": data}, config)
    exported = export(prepared, calibrated, tmp_path / "out", platform=config.platform)
    batches = Batches({"input": data}, input_specs(prepared.model), config.batch_size, what="calibration")
    return PlacementRun(prepared, batches, {"input": data[:16]}, base, calibrated, exported, tmp_path / "out")


def test_regions_of_a_small_model(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST)
    run = _placement_run(tmp_path, data, config)
    regions = quantized_regions(run.prepared.model.graph, run.base_calibrated)
    assert [r.nodes for r in regions] == [("conv1", "relu1"), ("conv2",)]
    assert regions[0].op_types(run.prepared.model.graph) == {"Conv": 1, "Relu": 1}


def test_a_region_slower_quantized_goes_float_and_loses_its_qdq(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = _placement_run(tmp_path, data, config)
    outcome = place(run, config, timer=FakeTimer(slow=("conv2",)))
    report = outcome.report
    decisions = {tuple(row["nodes"]): row["kept"] for row in report["regions"] if row["move"] == "region"}
    assert decisions == {("conv1", "relu1"): "quantized", ("conv2",): "float"}
    assert report["kept"] == "placed" and report["float_nodes"] == ["conv2"]
    assert report["final"]["batch_1"]["speedup_p50"] == pytest.approx(1.0)  # 1 ms each: fake times
    exported = onnx.load(str(outcome.exported.model_path))
    assert not _reads_dequantized(exported, "conv2") and _reads_dequantized(exported, "conv1")
    assert "conv2" in outcome.config.exclude_node_patterns


def test_iteration_stops_when_no_region_changes(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = _placement_run(tmp_path, data, config)
    timer = FakeTimer()  # every model 1 ms: nothing is clearly faster, so everything stays quantized
    report = place(run, config, timer=timer).report
    assert report["rounds"] == 1 and report["stopped"] == "no move changed the model"
    assert report["kept"] == "quantized"
    assert timer.calls == 5  # two regions, two op classes (Conv across both, relu1 split off), the final comparison
    everything = FakeTimer(slow=("conv1", "conv2"))
    report = place(run, config, timer=everything).report
    assert report["rounds"] <= MAX_ROUNDS and report["stopped"] == "no move changed the model"
    assert report["kept"] == "placed" and set(report["float_nodes"]) == {"conv1", "relu1", "conv2"}


def three_convs() -> onnx.ModelProto:
    """input (N, 4, 8, 8) → conv1 → softmax1 → conv2 → softmax2 → dwconv (depthwise, group 4) → out: three
    regions, one node each (Softmax stays float on the CPU EP)."""
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
        for name, shape in (("w1", (4, 4, 3, 3)), ("w2", (4, 4, 3, 3)), ("w3", (4, 1, 3, 3)))
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["c1"], ["s1"], name="softmax1", axis=1),
        helper.make_node("Conv", ["s1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Softmax", ["c2"], ["s2"], name="softmax2", axis=1),
        helper.make_node("Conv", ["s2", "w3"], ["out"], name="dwconv", pads=[1, 1, 1, 1], group=4),
    ]
    graph = helper.make_graph(
        nodes,
        "three_convs",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 8, 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_kernels_that_lose_only_together_go_float_as_an_op_class(tmp_path) -> None:
    """conv1 and conv2 cost 0.5 ms while either is quantized: neither region alone is faster float, the
    class of dense Convs is; the depthwise Conv (its own class) stays quantized."""
    data = np.random.default_rng(3).normal(size=(32, 4, 8, 8)).astype(np.float32)
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = _placement_run(tmp_path, data, config, three_convs())
    assert [r.nodes for r in quantized_regions(run.prepared.model.graph, run.base_calibrated)] == [
        ("conv1",),
        ("conv2",),
        ("dwconv",),
    ]
    report = place(run, config, timer=FakeTimer(slow=("conv1", "conv2"), joint=True)).report
    decisions = {(row["move"], tuple(row["nodes"])): row["kept"] for row in report["regions"] if row["round"] == 1}
    assert decisions == {
        ("region", ("conv1",)): "quantized",
        ("region", ("conv2",)): "quantized",
        ("region", ("dwconv",)): "quantized",
        ("op class Conv", ("conv1", "conv2")): "float",
    }
    assert report["kept"] == "placed" and sorted(report["float_nodes"]) == ["conv1", "conv2"]


def test_fp32_is_kept_when_faster_by_its_median_though_within_the_spread(tmp_path, data) -> None:
    """Every run of every model spreads from 0.6x to 2x its median (quartiles 0.8x, 1.4x): no move is clearly
    faster, and the quantized model's median, 1.3x FP32's, is within FP32's spread. A model never slower than
    FP32 is the promise, so FP32 is kept."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = _placement_run(tmp_path, data, config)
    timer = FakeTimer(slow=("conv1", "conv2"), penalty=0.3, joint=True, spread=True)
    report = place(run, config, timer=timer).report
    assert all(row["kept"] == "quantized" for row in report["regions"])
    assert report["kept"] == "fp32"
    even = place(run, config, timer=FakeTimer(spread=True)).report  # the same medians: the quantized model stays
    assert even["kept"] == "quantized"


def test_no_slower_than_fp32_is_judged_by_median_unless_a_gain_beyond_the_spread_pays() -> None:
    """Timings (p25, p50, p75 ms) at batch sizes 1 and 32 of a candidate against FP32's."""
    fp32 = {1: Timing(0.8, 1.0, 1.4, 9), 32: Timing(8.0, 10.0, 14.0, 9)}
    within_spread_slower = {1: Timing(1.0, 1.3, 1.8, 9), 32: Timing(10.0, 13.0, 18.0, 9)}
    assert not no_slower(within_spread_slower, fp32)  # 30 % slower by median everywhere: no
    assert no_slower({1: Timing(0.8, 1.01, 1.4, 9), 32: Timing(8.0, 10.1, 14.0, 9)}, fp32)  # within MIN_GAIN
    trade = {1: Timing(0.85, 1.05, 1.45, 9), 32: Timing(4.0, 5.0, 6.0, 9)}  # 5 % slower within the spread, 2x faster
    assert no_slower(trade, fp32)
    clearly_slower_once = {1: Timing(1.5, 1.6, 1.7, 9), 32: Timing(4.0, 5.0, 6.0, 9)}
    assert not no_slower(clearly_slower_once, fp32)


def test_the_round_limit_bounds_the_search(tmp_path, data, monkeypatch) -> None:
    monkeypatch.setattr(placement, "MAX_ROUNDS", 1)
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = _placement_run(tmp_path, data, config)
    report = place(run, config, timer=FakeTimer(slow=("conv2",))).report
    assert report["rounds"] == 1 and report["stopped"] == "round limit (1)"


def test_a_region_onnx_runtime_refuses_quantized_stays_float_with_the_reason(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = _placement_run(tmp_path, data, config)
    report = place(run, config, timer=FakeTimer(refused=("conv1",))).report
    row = next(row for row in report["regions"] if row["nodes"] == ["conv1", "relu1"])
    assert row["kept"] == "float" and "refuses" in row["reason"] and "injected" in row["reason"]


def test_a_cached_rerun_measures_nothing(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency", cpu_timing_cache=str(tmp_path / "cache"))
    run = _placement_run(tmp_path, data, config)
    first, second = FakeTimer(slow=("conv2",)), FakeTimer(slow=("conv2",))
    placed = place(run, config, timer=first).report
    again = place(run, config, timer=second).report
    assert first.calls > 0 and second.calls == 0
    assert again["measurements"] == 0 and again["cached_measurements"] == first.calls + placed["cached_measurements"]
    assert again["float_nodes"] == placed["float_nodes"] and all(row["cached"] for row in again["regions"])
    assert (tmp_path / "cache" / "cpu-timings.json").is_file()


def test_a_cached_rerun_stops_where_the_budget_stopped_the_first_run(tmp_path, data, monkeypatch) -> None:
    """Each fake measurement stands for 2 models x 2 batch sizes x 9 runs x 1 ms = 36 ms of timed runs: a 50 ms
    budget stops the first run after two of its four moves, and the rerun, from the cache, at the same place."""
    monkeypatch.setattr(placement, "BUDGET_S", 0.05)
    config = QuantizeConfig(**FAST, cpu_objective="latency", cpu_timing_cache=str(tmp_path / "cache"))
    run = _placement_run(tmp_path, data, config)
    first, second = FakeTimer(), FakeTimer()
    report = place(run, config, timer=first).report
    assert len(report["regions"]) == 2 and report["stopped"].startswith("time budget")
    again = place(run, config, timer=second).report
    assert second.calls == 0 and again["stopped"] == report["stopped"] and len(again["regions"]) == 2


def test_accuracy_objective_exports_what_the_stages_export_without_placement(tmp_path, data) -> None:
    path = save(two_regions(), tmp_path / "model.onnx")
    config = QuantizeConfig(**FAST, cpu_latency=False, cpu_objective="accuracy")
    result = quantize(path, {"input": data}, {"input": data[:8]}, config, tmp_path / "run")
    prepared = prepare(path)
    calibrated = calibrate(prepared, annotate(prepared, config), {"input": data}, config)
    today = export(prepared, calibrated, tmp_path / "verbs", platform=config.platform)
    assert result.model_path.read_bytes() == today.model_path.read_bytes()
    assert result.report["placement"] is None
    size = quantize(
        path,
        {"input": data},
        {"input": data[:8]},
        QuantizeConfig(**FAST, cpu_latency=False, cpu_objective="size"),
        tmp_path / "size",
    )
    assert size.model_path.read_bytes() == today.model_path.read_bytes()


def test_latency_objective_runs_in_the_pipeline_and_reports(tmp_path, data) -> None:
    """Real timings: only that the stage ran and reported, never which way it decided."""
    path = save(two_regions(), tmp_path / "model.onnx")
    config = QuantizeConfig(**FAST, cpu_objective="latency", cpu_threads=1, cpu_batch_sizes=(1, 4))
    calls = []
    result = quantize(
        path, {"input": data}, {"input": data[:8]}, config, tmp_path / "run", progress=lambda *c: calls.append(c)
    )
    assert "place" in [stage for stage, _, _ in calls]
    section = result.report["placement"]
    assert section["threads"] == 1 and section["batch_sizes"] == [1, 4]
    assert {tuple(row["nodes"]) for row in section["regions"] if row["round"] == 1 and row["move"] == "region"} == {
        ("conv1", "relu1"),
        ("conv2",),
    }
    assert set(section["final"]) == {"batch_1", "batch_4"} and section["kept"] in ("quantized", "placed", "fp32")
    assert result.report["latency"]["cpu"]["threads"] == 1 and result.report["latency"]["cpu"]["batch_sizes"] == [1, 4]
    assert undocumented(Report.model_validate(result.report)) == []


def test_latency_needs_the_onnxruntime_platform() -> None:
    with pytest.raises(ValueError, match="cpu_objective"):
        QuantizeConfig(platform="tensorrt", cpu_objective="latency")
    with pytest.raises(ValueError, match="cpu_batch_sizes"):
        QuantizeConfig(platform="onnxruntime", cpu_batch_sizes=(0,))
    with pytest.raises(ValueError, match="cpu_threads"):
        QuantizeConfig(platform="onnxruntime", cpu_threads=0)
    assert QuantizeConfig().cpu_objective == "accuracy"  # a library call places nothing unless asked
