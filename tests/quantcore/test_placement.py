"""Latency-aware placement (quantcore.analysis.placement): regions, decisions from an injected profiler and timer
(so the decisions are deterministic; no test here checks a speed), the timing cache, and the pipeline. The real
profiles behind the estimates: ``test_node_profile``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import onnx
import pytest

from jobs.report_schema import Report
from quantcore import QuantizeConfig, annotate, calibrate, export, prepare, quantize
from quantcore.analysis import placement
from quantcore.analysis.placement import place
from quantcore.analysis.regions import quantized_regions
from quantcore.evaluate.node_profile import NodeProfile, ProfiledNode
from quantcore.evaluate.paired_latency import Timing, no_slower
from tests.quantcore.models import save
from tests.quantcore.placement_cases import FAST, calibration_data, placement_run, reads_dequantized, two_regions
from tests.test_report_schema import undocumented


@pytest.fixture
def data() -> np.ndarray:
    return calibration_data()


# a noisy machine's runs as multiples of their median: quartiles at 0.8x and 1.4x
SPREAD = (0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.4, 1.6, 2.0)
# a profile's runs, as many as a verdict of "no slower" needs (paired_latency.MIN_RUNS): quartiles 0.7, 0.8, 0.9
PROFILE_SPREAD = (0.6, 0.7, 0.7, 0.8, 0.9, 0.9, 1.0)


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
                if any(reads_dequantized(model, name) for name in self.refused):
                    times.append("QLinearConv: not implemented (injected)")
                    continue
                slow = [reads_dequantized(model, name) for name in self.slow]
                time = 1.0 + self.penalty * (any(slow) if self.joint else sum(slow))
                times.append([time * factor for factor in self.factors])
            result[batch] = times
        return result


class FakeProfiler:
    """Deterministic profiles named as ONNX Runtime names them: in a model with Q/DQ, a node reading a
    dequantized tensor runs as ``<name>_token_7`` (QLinear<op>) taking ``quantized[name]`` µs (default 5), with a
    Relu after it fused in, each
    QuantizeLinear / DequantizeLinear of an activation 2 µs; in the FP32 model a Conv runs as ``<its output>_nchwc``
    and every node takes ``float_us[name]`` µs (default 10). ``refuse``: a model with Q/DQ is refused. Each of the
    7 runs takes the sum of the nodes' times; or, with ``run_ratio``, 1 ms for FP32 and ``run_ratio`` ms for a
    model with Q/DQ, times each of ``PROFILE_SPREAD``'s factors. ``runs``: the first so many of those runs only
    (a profile the budget cut short)."""

    def __init__(
        self,
        quantized: dict[str, float] | None = None,
        float_us: dict[str, float] | None = None,
        *,
        refuse=False,
        run_ratio: float | None = None,
        run_us=None,
        runs: int = len(PROFILE_SPREAD),
    ) -> None:
        self.quantized, self.float_us, self.refuse, self.run_ratio = quantized or {}, float_us or {}, refuse, run_ratio
        self.runs = runs
        self.run_us = run_us  # (model, batch size) → each run's µs, in place of the nodes' sum, times the factors
        self.calls = 0

    def __call__(self, models, batch_sizes):
        self.calls += 1
        return [self._profile(onnx.load_from_string(m), batch_sizes) for m in models]

    def _profile(self, model: onnx.ModelProto, batch_sizes):
        has_qdq = any(node.op_type == "QuantizeLinear" for node in model.graph.node)
        if has_qdq and self.refuse:
            return "QLinearConv: not implemented (injected)"
        written = {output for node in model.graph.node for output in node.output}
        fused: set[str] = set()  # written by an integer kernel
        nodes = []
        for node in model.graph.node:
            inputs, outputs = tuple(node.input), tuple(node.output)
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                if node.input[0] not in written:
                    continue  # a weight's: folded into the kernel that reads it
                nodes.append(ProfiledNode(node.name, node.op_type, inputs, outputs, 2.0))
            elif has_qdq and reads_dequantized(model, node.name):
                us = self.quantized.get(node.name, 5.0)
                nodes.append(ProfiledNode(f"{node.name}_token_7", f"QLinear{node.op_type}", inputs, outputs, us))
                fused.update(outputs)
            elif has_qdq and node.op_type == "Relu" and node.input[0] in fused:
                fused.update(outputs)  # the integer kernel before it runs it
            elif not has_qdq and node.op_type == "Conv":
                name = f"{node.output[0]}_nchwc"
                nodes.append(
                    ProfiledNode(name, "Conv", inputs, ("reorder_token_0",), self.float_us.get(node.name, 10.0))
                )
            else:
                nodes.append(ProfiledNode(node.name, node.op_type, inputs, outputs, self.float_us.get(node.name, 10.0)))
        factors = PROFILE_SPREAD[: self.runs]
        if self.run_us is not None:
            return {b: _profile(nodes, [self.run_us(model, b) * factor for factor in factors]) for b in batch_sizes}
        if self.run_ratio is None:
            runs = (sum(n.us for n in nodes),) * self.runs
        else:
            runs = tuple(1000.0 * (self.run_ratio if has_qdq else 1.0) * factor for factor in factors)
        return dict.fromkeys(batch_sizes, _profile(nodes, runs))


def placed_slower_than_all_quantized(model: onnx.ModelProto, _batch: int) -> float:
    """Run µs for ``FakeProfiler``: FP32 1000, all quantized 500, conv2 float (the placed model) 800."""
    if not any(node.op_type == "QuantizeLinear" for node in model.graph.node):
        return 1000.0
    return 500.0 if reads_dequantized(model, "conv2") else 800.0


def _profile(nodes: list[ProfiledNode], runs: Sequence[float]) -> NodeProfile:
    return NodeProfile(tuple(nodes), tuple(runs), sum(runs))


def test_regions_of_a_small_model(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST)
    run = placement_run(tmp_path, data, config)
    regions = quantized_regions(run.prepared.model.graph, run.base_calibrated)
    assert [r.nodes for r in regions] == [("conv1", "relu1"), ("conv2",)]
    assert regions[0].op_types(run.prepared.model.graph) == {"Conv": 1, "Relu": 1}


def test_a_region_whose_conversions_cost_more_than_its_kernel_saves_goes_float(tmp_path, data) -> None:
    """conv2 takes 10 µs float and 40 µs as its integer kernel (plus 2 µs per conversion): its region goes float
    and its Q/DQ go; conv1's region, 10 + 10 µs float against 5 µs quantized and 2 µs per conversion, stays."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    profiler = FakeProfiler(quantized={"conv2": 40.0})
    outcome = place(run, config, profiler=profiler, timer=FakeTimer(slow=("conv2",)))
    report = outcome.report
    first = {tuple(row["nodes"]): row for row in report["regions"] if row["round"] == 1}
    assert {nodes: row["kept"] for nodes, row in first.items()} == {
        ("conv1", "relu1"): "quantized",
        ("conv2",): "float",
    }
    assert first[("conv2",)]["cost"] > 0 > first[("conv1", "relu1")]["cost"]
    assert first[("conv2",)]["estimate"]["batch_1"] == {"float_us": 10.0, "quantized_us": 44.0}  # + s's Q, DQ
    assert report["kept"] == "placed" and report["float_nodes"] == ["conv2"]
    exported = onnx.load(str(outcome.exported.model_path))
    assert not reads_dequantized(exported, "conv2") and reads_dequantized(exported, "conv1")
    assert "conv2" in outcome.config.exclude_node_patterns
    # round 2 profiled the placed model (conv1's region again: quantized) and stopped; one profile a round
    assert report["rounds"] == 2 and report["stopped"] == "no region changed the model" and profiler.calls == 2
    # two profiles, nothing else: the second one's runs find the placed model faster than FP32 (42 against 50 µs)
    assert report["measurements"] == 2 and report["final_source"] == "profile"


def test_a_placed_model_slower_than_all_quantized_in_whole_runs_is_timed_against_it(tmp_path, data) -> None:
    """conv2's region is estimated slower quantized and goes float, but the whole runs say otherwise: all quantized
    runs at 0.5x FP32 in the first round's profile, placed at 0.8x in the second's. Each is no slower than FP32,
    yet the profiles do not settle it: the three are timed together, and the placed model, not clearly faster
    than all quantized there, gives way to it."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)

    timer = FakeTimer()
    profiler = FakeProfiler(quantized={"conv2": 40.0}, run_us=placed_slower_than_all_quantized)
    report = place(run, config, profiler=profiler, timer=timer).report
    assert [r["kept"] for r in report["regions"] if r["round"] == 1] == ["quantized", "float"]
    assert report["final_source"] == "timed" and timer.calls == 1 and report["kept"] == "quantized"


def test_every_region_estimated_slower_leaves_fp32_untimed_twice(tmp_path, data) -> None:
    """Both regions estimated slower quantized go float in round 1; nothing quantized is left to profile, and
    the placed model, FP32's twin, is not timed beside FP32: FP32 is kept by the final comparison."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    profiler = FakeProfiler({"conv1": 100.0, "conv2": 40.0})
    report = place(run, config, profiler=profiler, timer=FakeTimer(slow=("conv1", "conv2"))).report
    assert [row["kept"] for row in report["regions"]] == ["float", "float"] and profiler.calls == 1
    assert report["stopped"] == "no quantized region left" and report["kept"] == "fp32"
    assert report["final"]["batch_1"]["placed"] is None and report["final"]["batch_1"]["quantized"] is not None
    assert sorted(report["float_nodes"]) == ["conv1", "conv2", "relu1"]


def test_a_gain_beyond_the_spread_against_a_loss_within_it_is_timed_before_fp32_is_kept(tmp_path, data) -> None:
    """Both regions are estimated slower quantized and go float, leaving FP32's twin. In the first round's profile
    the fully quantized model runs 4 % slower than FP32 at batch 1, within the spread, and 2x faster at batch 32.
    Read without the trade, the profile would keep FP32; the whole runs decide instead (the timer: even
    medians), and keep the quantized model."""
    config = QuantizeConfig(**FAST, cpu_objective="latency", cpu_batch_sizes=(1, 32))
    run = placement_run(tmp_path, data, config)

    def run_us(model: onnx.ModelProto, batch: int) -> float:
        if not any(node.op_type == "QuantizeLinear" for node in model.graph.node):
            return 1000.0
        return 1040.0 if batch == 1 else 500.0

    timer = FakeTimer()
    profiler = FakeProfiler({"conv1": 100.0, "conv2": 40.0}, run_us=run_us)
    report = place(run, config, profiler=profiler, timer=timer).report
    assert [row["kept"] for row in report["regions"]] == ["float", "float"]
    assert report["final_source"] == "timed" and timer.calls == 1 and report["kept"] == "quantized"


def test_every_region_estimated_faster_quantized_stays(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    timer = FakeTimer()
    report = place(run, config, profiler=FakeProfiler(), timer=timer).report
    assert report["rounds"] == 1 and report["stopped"] == "no region changed the model"
    assert report["kept"] == "quantized" and all(row["kept"] == "quantized" for row in report["regions"])
    assert timer.calls == 0 and report["final_source"] == "profile"  # the profile's runs: faster than FP32


def test_regions_without_an_estimate_are_timed_within_the_timing_budget(tmp_path, data, monkeypatch) -> None:
    """A quantized model ONNX Runtime will not profile leaves every region without an estimate: each is timed
    as a whole-model pair (the old way) while the budget lasts. The FP32 profile's runs take 50 µs (its five
    nodes), so a pair is estimated at 2 batch sizes x 200 runs x 2 x 50 µs = 40 ms and the final comparison of
    three models at 60 ms; a fake pair takes 2 batch sizes x 9 runs x both models' times (1 ms, 1.5 ms while
    conv2 is quantized): 54 ms for conv1's region, then 45 ms for conv2's. A budget of 120 ms lets both run
    and round 2 profile (0.7 ms), not round 2's pair (100 + 40 ms) nor the final comparison, so the profiles
    decide: refused, they show no quantized model no slower than FP32, which is kept. A budget of 0 s times
    nothing after the first profile; ample budget times every pair and the final comparison."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config, calibration_seconds=0.12 / config.cpu_timing_share)
    timer = FakeTimer(slow=("conv2",))
    report = place(run, config, profiler=FakeProfiler(refuse=True), timer=timer).report
    first = [row for row in report["regions"] if row["round"] == 1]
    assert [row["kept"] for row in first] == ["quantized", "float"] and all(row["cost"] is None for row in first)
    assert first[1]["timings"]["batch_1"]["float"]["p50_ms"] == pytest.approx(1.0)
    second = [row for row in report["regions"] if row["round"] == 2]
    assert [row["reason"] for row in second] == ["no estimate, and the timing budget (0.12 s) is spent"]
    assert timer.calls == 2 and report["final_source"] == "profiles" and report["kept"] == "fp32"
    assert report["timed_seconds"] == pytest.approx(0.054 + 0.045 + 0.0014, abs=1e-3)  # reported to the ms
    broke = replace(run, calibration_seconds=0.0)
    timer = FakeTimer(slow=("conv2",))
    spent = place(broke, config, profiler=FakeProfiler(refuse=True), timer=timer).report
    assert all(row["kept"] == "quantized" for row in spent["regions"]) and timer.calls == 0
    timer = FakeTimer(slow=("conv2",))
    ample = place(replace(run, calibration_seconds=100.0), config, profiler=FakeProfiler(refuse=True), timer=timer)
    assert ample.report["kept"] == "placed" and ample.report["final_source"] == "timed" and timer.calls == 4


def test_a_round_the_budget_cannot_profile_leaves_the_model_of_the_round_before(tmp_path, data) -> None:
    """conv2's region is estimated slower quantized, but every run takes 60-100 ms (medians 80 ms): the first
    profile's runs (7 of each model at each batch size) take 2.24 s, past a budget of 2 s already, so the model
    without conv2 is not profiled. The estimate alone does not change the model: conv2 stays quantized, its row
    says why, and the first profile keeps the quantized model (even medians). A timing share of 2 (a budget of
    4 s) lets the same profiles send conv2 float."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config, calibration_seconds=2.0 / config.cpu_timing_share)
    profiler, timer = FakeProfiler({"conv2": 40.0}, run_us=lambda _model, _batch: 100_000.0), FakeTimer()
    report = place(run, config, profiler=profiler, timer=timer).report
    conv2 = next(row for row in report["regions"] if row["nodes"] == ["conv2"])
    assert conv2["kept"] == "quantized" and conv2["reason"].endswith(
        "left quantized: the timing budget has no room to profile the model without it"
    )
    assert report["stopped"] == "timing budget (2 s of runs) spent" and report["rounds"] == 1
    assert report["kept"] == "quantized" and report["float_nodes"] == [] and report["final_source"] == "profile"
    assert profiler.calls == 1 and timer.calls == 0 and report["timed_seconds"] == pytest.approx(2.24)
    ample = place(run, replace(config, cpu_timing_share=2.0), profiler=profiler).report
    assert ample["float_nodes"] == ["conv2"] and ample["timing_budget_s"] == pytest.approx(4.0)


def test_regions_estimated_to_save_under_the_minimum_gain_stay_quantized(tmp_path, data) -> None:
    """conv2's region is estimated 5 µs slower quantized (11 µs and two 2 µs conversions against 10 µs float), but
    the softmax between the regions takes 1 ms: 0.5 % of FP32's time is not worth a round. Without the softmax's
    millisecond the same 5 µs are 10 % of it, and conv2 goes float."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    profiler = FakeProfiler({"conv2": 11.0}, {"softmax": 1000.0})
    report = place(run, config, profiler=profiler, timer=FakeTimer()).report
    conv2 = next(row for row in report["regions"] if row["nodes"] == ["conv2"])
    assert conv2["cost"] > 0 and conv2["kept"] == "quantized"
    assert conv2["reason"].endswith("left quantized: together they save 0.5% of FP32's time, under 2%")
    assert report["stopped"] == "no region changed the model" and profiler.calls == 1 and report["float_nodes"] == []
    noticeable = place(run, config, profiler=FakeProfiler({"conv2": 11.0}), timer=FakeTimer()).report
    conv2 = next(row for row in noticeable["regions"] if row["nodes"] == ["conv2"])
    assert conv2["kept"] == "float" and noticeable["rounds"] == 2


def test_without_budget_for_the_final_comparison_the_profiles_decide(tmp_path, data, monkeypatch) -> None:
    """The scenario of the timed comparison above (all quantized at 0.5x FP32 in the first round's profile, placed
    at 0.8x in the second's), with a budget of 40 ms: both profiles fit (16.8 ms, then 20.2 ms of runs), three
    models timed at 2 batch sizes x 7 runs x 1 ms at least (42 ms more) do not. The comparison's rule reads the
    profiles instead: the placed model did not gain on all quantized, which is no slower than FP32 in its
    round, and is kept."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config, calibration_seconds=0.04 / config.cpu_timing_share)

    timer = FakeTimer()
    report = place(
        run, config, profiler=FakeProfiler({"conv2": 40.0}, run_us=placed_slower_than_all_quantized), timer=timer
    ).report
    assert report["rounds"] == 2 and timer.calls == 0
    assert report["final_source"] == "profiles" and report["kept"] == "quantized"
    assert report["final"]["batch_1"]["quantized"]["p50_ms"] == pytest.approx(0.4)
    assert report["final"]["batch_1"]["speedup_p50"] == pytest.approx(2.0)


def test_a_quantized_model_is_not_kept_on_too_few_profile_runs_however_small_the_budget(tmp_path, data) -> None:
    """The scenario above with each profile cut short at two runs a batch size (a batch of 32 that takes tens of
    ms, under a budget of 20 ms) and the first round's runs of all quantized at 0.5x FP32's time. Two runs cannot
    promise it no slower than FP32: the final comparison is timed although the budget has no room for it (the
    profiles' runs alone take 8.6 ms, three models x 2 batch sizes x 7 runs x 0.65 ms more do not fit), the
    report says why, and the whole runs decide: FP32 is kept where they run both quantized models 1.5x slower,
    and the quantized model where they run it as fast."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config, calibration_seconds=0.02 / config.cpu_timing_share)

    profiler = FakeProfiler({"conv2": 40.0}, run_us=placed_slower_than_all_quantized, runs=2)
    timer = FakeTimer(slow=("conv1",))  # conv1 is quantized in both: 1.5 ms against FP32's 1 ms
    report = place(run, config, profiler=profiler, timer=timer).report
    assert report["rounds"] == 2 and timer.calls == 1 and report["final_source"] == "timed"
    assert report["kept"] == "fp32" and report["final"]["batch_1"]["quantized"]["p50_ms"] == pytest.approx(1.5)
    assert report["past_budget"] == (
        "the profiles' runs (2 at batch 1, 2 at batch 32) are too few to promise the quantized model no slower than "
        "FP32 (7 a batch size, or 4 far apart); the final comparison was timed past the budget"
    )
    assert report["timed_seconds"] > report["timing_budget_s"] == pytest.approx(0.02)
    even = place(run, config, profiler=profiler, timer=FakeTimer()).report
    assert even["kept"] == "quantized" and even["final_source"] == "timed" and even["past_budget"]


def test_four_profile_runs_far_apart_keep_a_quantized_model_without_a_timing(tmp_path, data) -> None:
    """The scenario above with four runs a batch size, as a profile gets where the model it profiles runs far faster
    than FP32 (``paired_latency.within_reach``): all quantized at 0.5x FP32's time, its runs 0.3-0.4 ms (its span
    0.3-0.35 ms: the slowest let off) against FP32's from 0.6 ms. Those runs promise it no slower: it is kept from
    the profiles, nothing more is timed. Four runs of a quantized model 0.9x FP32's time overlap FP32's: the final
    comparison is timed past the budget."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config, calibration_seconds=0.02 / config.cpu_timing_share)
    profiler = FakeProfiler({"conv2": 40.0}, run_us=placed_slower_than_all_quantized, runs=4)
    timer = FakeTimer()
    report = place(run, config, profiler=profiler, timer=timer).report
    assert report["kept"] == "quantized" and report["final_source"] == "profiles" and timer.calls == 0
    assert report["past_budget"] is None and report["final"]["batch_32"]["quantized"]["high_ms"] == pytest.approx(0.35)

    def close(model: onnx.ModelProto, _batch: int) -> float:
        return 900.0 if any(node.op_type == "QuantizeLinear" for node in model.graph.node) else 1000.0

    close_report = place(run, config, profiler=FakeProfiler({"conv2": 40.0}, run_us=close, runs=4), timer=timer).report
    assert close_report["final_source"] == "timed" and timer.calls == 1
    assert "(4 at batch 1, 4 at batch 32) are too few" in close_report["past_budget"]


def test_fp32_is_kept_when_faster_by_its_median_though_within_the_spread(tmp_path, data) -> None:
    """Every region is estimated faster quantized, but the quantized model's whole runs have a median 1.3x FP32's,
    within FP32's spread (runs from 0.6x to 2x their median). A model never slower than FP32 is the promise: the
    profile's runs do not keep the quantized model, the final comparison times it, and FP32 wins when the timing
    agrees; when the timing finds the medians even, the quantized model stays. Profile runs with even medians
    keep it without a timing."""
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    slower = FakeProfiler(run_ratio=1.3)
    timer = FakeTimer(slow=("conv1", "conv2"), penalty=0.3, joint=True, spread=True)
    report = place(run, config, profiler=slower, timer=timer).report
    assert all(row["kept"] == "quantized" for row in report["regions"])
    assert report["kept"] == "fp32" and report["final_source"] == "timed" and timer.calls == 1
    timer = FakeTimer(spread=True)  # the same medians
    even = place(run, config, profiler=slower, timer=timer).report
    assert even["kept"] == "quantized" and timer.calls == 1
    timer = FakeTimer(slow=("conv1", "conv2"), penalty=0.3, joint=True, spread=True)
    trusted = place(run, config, profiler=FakeProfiler(run_ratio=1.0), timer=timer).report
    assert trusted["kept"] == "quantized" and trusted["final_source"] == "profile" and timer.calls == 0


def test_no_slower_than_fp32_is_judged_by_median_unless_a_gain_beyond_the_spread_pays() -> None:
    """Timings (p25, p50, p75 ms) at batch sizes 1 and 32 of a candidate against FP32's."""
    fp32 = {1: quartiles(0.8, 1.0, 1.4), 32: quartiles(8.0, 10.0, 14.0)}
    within_spread_slower = {1: quartiles(1.0, 1.3, 1.8), 32: quartiles(10.0, 13.0, 18.0)}
    assert not no_slower(within_spread_slower, fp32)  # 30 % slower by median everywhere: no
    assert no_slower({1: quartiles(0.8, 1.01, 1.4), 32: quartiles(8.0, 10.1, 14.0)}, fp32)  # within MIN_GAIN
    trade = {1: quartiles(0.85, 1.05, 1.45), 32: quartiles(4.0, 5.0, 6.0)}  # 5 % slower within the spread, 2x faster
    assert no_slower(trade, fp32) and not no_slower(trade, fp32, trade=False)
    clearly_slower_once = {1: quartiles(1.5, 1.6, 1.7), 32: quartiles(4.0, 5.0, 6.0)}
    assert not no_slower(clearly_slower_once, fp32)


def quartiles(p25: float, p50: float, p75: float) -> Timing:
    """Nine runs' ``Timing``, its extremes a quarter beyond its quartiles."""
    return Timing(p25 * 0.75, p25, p50, p75, p75 * 1.25, 9)


def test_the_round_limit_bounds_the_search(tmp_path, data, monkeypatch) -> None:
    monkeypatch.setattr(placement, "MAX_ROUNDS", 1)
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    report = place(run, config, profiler=FakeProfiler({"conv2": 40.0}), timer=FakeTimer(slow=("conv2",))).report
    assert report["rounds"] == 1 and report["stopped"] == "round limit (1)"


def test_a_region_onnx_runtime_refuses_quantized_stays_float_with_the_reason(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency")
    run = placement_run(tmp_path, data, config)
    report = place(run, config, profiler=FakeProfiler(refuse=True), timer=FakeTimer(refused=("conv1",))).report
    row = next(row for row in report["regions"] if row["nodes"] == ["conv1", "relu1"])
    assert row["kept"] == "float" and "refuses" in row["reason"] and "injected" in row["reason"]


def test_a_cached_rerun_measures_nothing(tmp_path, data) -> None:
    config = QuantizeConfig(**FAST, cpu_objective="latency", cpu_timing_cache=str(tmp_path / "cache"))
    run = placement_run(tmp_path, data, config)
    # profile runs that leave the choice to the final comparison: both kinds of measurement are cached
    profilers = FakeProfiler({"conv2": 40.0}, run_ratio=1.3), FakeProfiler({"conv2": 40.0}, run_ratio=1.3)
    timers = FakeTimer(slow=("conv2",)), FakeTimer(slow=("conv2",))
    placed = place(run, config, profiler=profilers[0], timer=timers[0]).report
    again = place(run, config, profiler=profilers[1], timer=timers[1]).report
    assert profilers[0].calls > 0 and timers[0].calls > 0 and profilers[1].calls == timers[1].calls == 0
    assert again["measurements"] == 0 and again["cached_measurements"] == placed["measurements"]
    assert again["float_nodes"] == placed["float_nodes"] and all(row["cached"] for row in again["regions"])
    assert (tmp_path / "cache" / "cpu-timings.json").is_file()


def test_a_cached_rerun_stops_where_the_budget_stopped_the_first_run(tmp_path, data, monkeypatch) -> None:
    """Regions without an estimate and a budget for one fake pair (estimated 40 ms, its runs 36 ms): the first run
    times one region, and the rerun, from the cache, the same one."""
    config = QuantizeConfig(**FAST, cpu_objective="latency", cpu_timing_cache=str(tmp_path / "cache"))
    run = placement_run(tmp_path, data, config, calibration_seconds=0.06 / config.cpu_timing_share)
    first, second = FakeTimer(), FakeTimer()
    report = place(run, config, profiler=FakeProfiler(refuse=True), timer=first).report
    timed = [bool(row["timings"]) for row in report["regions"]]
    assert timed == [True, False]
    again = place(run, config, profiler=FakeProfiler(refuse=True), timer=second).report
    assert second.calls == 0 and [bool(row["timings"]) for row in again["regions"]] == timed


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
    assert {tuple(row["nodes"]) for row in section["regions"] if row["round"] == 1} == {
        ("conv1", "relu1"),
        ("conv2",),
    }
    assert set(section["final"]) == {"batch_1", "batch_4"} and section["kept"] in ("quantized", "placed", "fp32")
    assert result.report["latency"]["cpu"]["threads"] == 1 and result.report["latency"]["cpu"]["batch_sizes"] == [1, 4]
    assert undocumented(Report.model_validate(result.report)) == []
    calibrated = result.report["stage_seconds"]["calibrate"]  # the budget's base (a resumed job: its checkpoint's)
    assert section["timing_budget_s"] == pytest.approx(calibrated * config.cpu_timing_share, abs=1e-3)


def test_latency_needs_the_onnxruntime_platform() -> None:
    with pytest.raises(ValueError, match="cpu_objective"):
        QuantizeConfig(platform="tensorrt", cpu_objective="latency")
    with pytest.raises(ValueError, match="cpu_batch_sizes"):
        QuantizeConfig(platform="onnxruntime", cpu_batch_sizes=(0,))
    with pytest.raises(ValueError, match="cpu_threads"):
        QuantizeConfig(platform="onnxruntime", cpu_threads=0)
    assert QuantizeConfig().cpu_objective == "accuracy"  # a library call places nothing unless asked
