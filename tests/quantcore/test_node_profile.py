"""The node profiler (quantcore.evaluate.node_profile) on real ONNX Runtime profiles: how they are traced back
to the placement's regions (structure only), when short runs are timed again unprofiled, how many rounds a
spent budget leaves, a node's time from its runs, and the cache the profiles are kept in."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from quantcore import QuantizeConfig
from quantcore.analysis.region_costs import attribute, region_costs
from quantcore.analysis.regions import quantized_regions
from quantcore.evaluate import latency_cache, node_profile, paired_latency
from quantcore.evaluate.cpu_latency import BLOCK_RUNS
from quantcore.evaluate.latency_cache import TimingCache
from quantcore.evaluate.node_profile import NodeProfile, ProfiledNode, profile_nodes
from quantcore.evaluate.paired_latency import SEPARATED_RUNS, Timing, conclusive, within_reach
from quantcore.export.qdq import build_qdq_model
from quantcore.runtime.batching import input_specs
from tests.quantcore.models import matmuls
from tests.quantcore.placement_cases import FAST, calibration_data, placement_run


@pytest.fixture
def data() -> np.ndarray:
    return calibration_data()


def test_real_profiles_are_traced_back_to_their_regions(tmp_path, data) -> None:
    """ONNX Runtime's own names: the QDQ model's conv1 runs fused as ``conv1_token_<n>`` (QLinearConv), the FP32
    model's conv2 as an NCHWc Conv named after relu2's output (``out_nchwc``); both are found, and every region
    gets an estimate at each batch size. Structure only: which way the estimate points is the machine's."""
    config = QuantizeConfig(**FAST)
    run = placement_run(tmp_path, data, config)
    graph = run.prepared.model.graph
    regions = quantized_regions(graph, run.base_calibrated)
    qdq = build_qdq_model(run.prepared, run.base_calibrated)
    models = [run.prepared.model.SerializeToString(), qdq.SerializeToString()]
    fp32, quantized = profile_nodes(models, (1, 4), specs=input_specs(run.prepared.model), sample=run.sample, threads=1)
    assert isinstance(fp32, dict) and isinstance(quantized, dict) and set(fp32) == set(quantized) == {1, 4}
    owners = dict(zip((n.name for n in quantized[1].nodes), attribute(quantized[1], qdq.graph, regions), strict=True))
    fused = [n for n in quantized[1].nodes if n.op_type == "QLinearConv"]
    assert [n.name.split("_token_")[0] for n in fused] == ["conv1"] and owners[fused[0].name] == 0
    assert owners["input_QuantizeLinear"] == 0  # the region's boundary conversion
    fp32_owners = attribute(fp32[1], graph, regions)
    convs = {n.name: owner for n, owner in zip(fp32[1].nodes, fp32_owners, strict=True) if n.op_type == "Conv"}
    assert convs == {"r1_nchwc": 0, "out_nchwc": 1}
    costs = region_costs(fp32, graph, quantized, qdq.graph, regions)
    assert all(cost.cost is not None and set(cost.float_us) == {1, 4} for cost in costs)


class _CountingSession:
    """A real session that counts the runs made while it profiled and after its profiling ended."""

    def __init__(self, session) -> None:
        self.session, self.ended, self.before, self.after = session, False, 0, 0

    def run(self, *args, **kwargs):
        self.after += self.ended
        self.before += not self.ended
        return self.session.run(*args, **kwargs)

    def end_profiling(self):
        self.ended = True
        return self.session.end_profiling()


def _counted(monkeypatch) -> list[_CountingSession]:
    """The sessions ``profile_nodes`` makes from now on, counting their runs."""
    sessions: list[_CountingSession] = []
    real = node_profile.latency_session

    def counting(*args, **kwargs):
        sessions.append(_CountingSession(real(*args, **kwargs)))
        return sessions[-1]

    monkeypatch.setattr(node_profile, "latency_session", counting)
    return sessions


@pytest.mark.parametrize("node_us", [0.0, 1e6])
def test_short_profiled_runs_are_timed_again_unprofiled(tmp_path, data, monkeypatch, node_us) -> None:
    """The profiler's cost per node can be most of a short run, so where it could reach MIN_GAIN of the run the
    whole-run durations come from unprofiled runs in the same sessions, after profiling ended. A cost of 0 µs
    per node never asks for them; one of a second always does: one untimed run, then as many timed runs as the
    profile reports, per model and batch size. Which way the times point is the machine's, not checked."""
    monkeypatch.setattr(node_profile, "PROFILER_NODE_US", node_us)
    sessions = _counted(monkeypatch)
    config = QuantizeConfig(**FAST)
    run = placement_run(tmp_path, data, config)
    qdq = build_qdq_model(run.prepared, run.base_calibrated)
    models = [run.prepared.model.SerializeToString(), qdq.SerializeToString()]
    profiles = profile_nodes(models, (1, 4), specs=input_specs(run.prepared.model), sample=run.sample, threads=1)
    assert all(isinstance(p, dict) and set(p) == {1, 4} for p in profiles)
    for session, profile in zip(sessions, profiles, strict=True):
        expected = sum(1 + profile[b].runs for b in (1, 4)) if node_us else 0
        assert session.after == expected and all(profile[b].runs >= node_profile.MIN_RUNS for b in (1, 4))
        for b in (1, 4):  # the budget counts the profiled runs the unprofiled ones replaced, too
            replaced = profile[b].timed_us > sum(profile[b].run_times_us)
            assert replaced if node_us else profile[b].timed_us == pytest.approx(sum(profile[b].run_times_us))


def test_a_spent_budget_stops_each_batch_size_after_two_rounds(tmp_path, data) -> None:
    """With its seconds spent the profile makes ``MIN_RUNS`` rounds, two: a third would cost the first profile
    of a large model half a calibration's samples. Where unprofiled runs replace a small model's profiled ones,
    they make one round: a block of ``BLOCK_RUNS`` runs in a row of each model (as many cost less than
    a millisecond here)."""
    config = QuantizeConfig(**FAST)
    run = placement_run(tmp_path, data, config)
    qdq = build_qdq_model(run.prepared, run.base_calibrated)
    models = [run.prepared.model.SerializeToString(), qdq.SerializeToString()]
    specs = input_specs(run.prepared.model)
    profiles = profile_nodes(models, (1, 4), specs=specs, sample=run.sample, threads=1, budget_s=0.0)
    assert node_profile.MIN_RUNS == 2 and all(isinstance(p, dict) for p in profiles)
    for profile in profiles:
        for b in (1, 4):
            replaced = profile[b].timed_us > sum(profile[b].run_times_us)
            assert profile[b].runs == (BLOCK_RUNS if replaced else node_profile.MIN_RUNS), (b, replaced)


def test_a_spent_budget_goes_on_to_a_verdict_within_reach_of_a_model_far_faster_than_the_first() -> None:
    """One MatMul against 32 (about 1 against 100 ms on one thread here: apart beyond what a loaded machine's
    preemptions add to a run), the budget spent at once: profiled with ``within_reach``, the slow reference first,
    each runs ``SEPARATED_RUNS``, enough for a verdict; the fast one first (no verdict of "no slower" to reach),
    or without ``extend``, ``MIN_RUNS``."""
    light, heavy = matmuls(1), matmuls(32)
    specs, models = input_specs(light), [heavy.SerializeToString(), light.SerializeToString()]
    options = {"specs": specs, "sample": None, "threads": 1, "budget_s": 0.0}
    reached = profile_nodes(models, (1,), **options, extend=within_reach)
    assert [p[1].runs for p in reached] == [SEPARATED_RUNS, SEPARATED_RUNS]
    assert conclusive({1: Timing.of(reached[1][1].run_times_us)}, {1: Timing.of(reached[0][1].run_times_us)})
    assert [p[1].runs for p in profile_nodes(models[::-1], (1,), **options, extend=within_reach)] == [2, 2]
    assert [p[1].runs for p in profile_nodes(models, (1,), **options)] == [node_profile.MIN_RUNS] * 2


def test_unprofiled_runs_stop_once_the_models_lie_far_apart(monkeypatch) -> None:
    """The profiler's cost made to weigh on every run (a second per node), so unprofiled runs replace the profiled
    ones; one MatMul against 32 (about 1 against 100 ms on one thread) lie far apart, and with 30 s of budget the
    unprofiled rounds stop in the round that gives each model ``paired_latency.MIN_RUNS`` runs (a conclusive verdict,
    and a median of several rounds), where the budget alone would run the slower ``UNPROFILED_RUNS`` times (five
    seconds)."""
    monkeypatch.setattr(node_profile, "PROFILER_NODE_US", 1e6)
    light, heavy = matmuls(1), matmuls(32)
    models = [heavy.SerializeToString(), light.SerializeToString()]
    slow, fast = profile_nodes(models, (1,), specs=input_specs(light), sample=None, threads=1, budget_s=30.0)
    assert min(slow[1].runs, fast[1].runs) >= paired_latency.MIN_RUNS
    assert slow[1].runs < paired_latency.MIN_RUNS + BLOCK_RUNS < node_profile.UNPROFILED_RUNS
    assert conclusive({1: Timing.of(fast[1].run_times_us)}, {1: Timing.of(slow[1].run_times_us)})


def test_profiled_runs_the_unprofiled_ones_replace_are_not_extended(monkeypatch) -> None:
    """As above with the budget spent at once and ``within_reach``: the profiled rounds stop at ``MIN_RUNS``, since
    their durations will not be the verdict (where the profiler's cost does not weigh they go on to
    ``SEPARATED_RUNS``, as in the within-reach test above), and the unprofiled runs reach the verdict instead."""
    monkeypatch.setattr(node_profile, "PROFILER_NODE_US", 1e6)
    sessions = _counted(monkeypatch)
    light, heavy = matmuls(1), matmuls(32)
    models = [heavy.SerializeToString(), light.SerializeToString()]
    options = {"specs": input_specs(light), "sample": None, "threads": 1, "budget_s": 0.0}
    slow, fast = profile_nodes(models, (1,), **options, extend=within_reach)
    assert [s.before for s in sessions] == [1 + node_profile.MIN_RUNS] * 2  # the untimed run and the timed ones
    assert slow[1].runs == SEPARATED_RUNS
    assert conclusive({1: Timing.of(fast[1].run_times_us)}, {1: Timing.of(slow[1].run_times_us)})


def test_a_node_time_is_its_lower_median_so_a_preempted_run_does_not_count() -> None:
    """Two timed runs (after the untimed first), the node's kernel 10 µs in one and 30 µs in the other (a run
    other processes preempted): the node reads 10 µs, the runs their own spans. Of three runs, the middle."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )

    def events(kernels: Sequence[float]) -> list[dict]:
        spans = [{"name": "model_run", "ts": 1000 * i, "dur": 100 + k} for i, k in enumerate([50.0, *kernels])]
        nodes = [
            {"cat": "Node", "name": "relu_kernel_time", "ts": 1000 * i + 1, "dur": k, "args": {"op_name": "Relu"}}
            for i, k in enumerate([50.0, *kernels])
        ]
        return spans + nodes

    two = node_profile._parse(events([10.0, 30.0]), graph, (1,), (2,))[1]
    assert [n.us for n in two.nodes] == [10.0] and two.run_times_us == (110.0, 130.0) and two.timed_us == 240.0
    three = node_profile._parse(events([30.0, 10.0, 20.0]), graph, (1,), (3,))[1]
    assert [n.us for n in three.nodes] == [20.0]


def test_the_timing_cache_drops_the_oldest_entries_past_its_byte_cap(tmp_path, monkeypatch) -> None:
    """Node profiles are ~100x a timing's size: the cache is bounded by its JSON bytes as well as its entries."""
    profile = NodeProfile((ProfiledNode("conv1_token_7", "QLinearConv", ("x",), ("y",), 5.0),), (5.0, 5.0, 5.0), 15.0)
    size = len(json.dumps([{"1": profile.to_dict()}]))
    monkeypatch.setattr(latency_cache, "MAX_BYTES", 2 * size + 1)  # two entries fit, not three
    cache = TimingCache(tmp_path)
    for key in ("a", "b", "c"):
        cache.put_profiles(key, [{1: profile}])
    assert cache.get_profiles("a") is None
    assert cache.get_profiles("b") == cache.get_profiles("c") == [{1: profile}]


def test_the_profiler_cost_counts_the_nodes_inside_subgraphs() -> None:
    """An If whose branches hold 3 and 2 nodes is one node at the top level, but the profiler times every node
    it runs inside a branch: the count that decides whether its cost weighs on a run takes all of them (1 + 5),
    so a model built around one If (silero-vad's optimized graph: 2 nodes, 57 profiled) is not read as tiny."""
    value = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]

    def branch(count: int) -> onnx.GraphProto:
        names = ["x", *(f"t{i}" for i in range(count - 1)), "y"]
        nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(count)]
        return helper.make_graph(nodes, f"branch{count}", [], value)

    condition = helper.make_node("If", ["c"], ["y"], then_branch=branch(3), else_branch=branch(2))
    graph = helper.make_graph(
        [condition],
        "g",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        value,
    )
    assert len(graph.node) == 1 and node_profile._node_count(graph) == 6
