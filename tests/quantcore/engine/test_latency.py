"""CPU latency: plain-JSON structure and sane numbers for FP32 vs quantized at batch 1 and 32."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import quantcore
from quantcore.errors import Canceled, InvalidDataError
from quantcore.evaluate.cpu_latency import (
    BLOCK_RUNS,
    MIN_RUNS,
    LatencySettings,
    cpu_latency,
    feeds_for,
    interleaved_runs,
    latency_session,
    summarize,
)
from quantcore.progress import Monitor
from quantcore.runtime.batching import InputSpec
from quantcore.runtime.session import SPIN_OFF
from tests.quantcore.models import conv_bn_residual, save

FAST = LatencySettings(warmup=2, runs=12, budget_s=None)  # enough for percentiles; the numbers are not asserted on


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("latency")
    model = conv_bn_residual()
    path = save(model, directory / "model.onnx")
    data = {"input": np.random.default_rng(0).normal(size=(32, 3, 8, 8)).astype(np.float32)}
    result = quantcore.quantize(path, data, data, quantcore.QuantizeConfig(), directory / "out")
    return path, result.model_path, data, directory


def test_summary_percentiles_are_ordered() -> None:
    summary = summarize([3.0, 1.0, 2.0, 10.0, 1.5], batch=4)
    assert summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert summary["p50_ms"] == 2.0 and summary["runs"] == 5
    assert summary["throughput_samples_per_s"] == pytest.approx(4 * 5 / (17.5 / 1000))


def _check(summary: dict, batch: int) -> None:
    assert summary["batch"] == batch and summary["runs"] == FAST.runs
    assert 0 < summary["min_ms"] <= summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert summary["throughput_samples_per_s"] > 0


def test_cpu_latency_dynamic_batch(models) -> None:
    fp32, quantized, data, _ = models
    result = cpu_latency(fp32, quantized, sample=data, settings=FAST)
    assert json.loads(json.dumps(result, allow_nan=False)) == result  # plain JSON
    assert result["batch_sizes"] == [1, 32] and result["device"] == "cpu"
    for label in ("fp32", "quantized"):
        assert set(result[label]) == {"batch_1", "batch_32"}
        for batch in (1, 32):
            _check(result[label][f"batch_{batch}"], batch)
    assert all(v > 0 for v in result["speedup_p50"].values())


def test_every_measured_session_runs_without_intra_op_spinning(models, tmp_path) -> None:
    """An idle session's spinning threads take the cores from the one running, so every session the latency
    stage, the node profiles and the placement's timings open has spinning off, and the report says so."""
    fp32, quantized, data, _ = models
    for session in (latency_session(str(fp32), 2), latency_session(str(quantized), 1, profile_to=tmp_path)):
        assert session.get_session_options().get_session_config_entry(SPIN_OFF[0]) == SPIN_OFF[1] == "0"
    result = cpu_latency(fp32, quantized, sample=data, settings=FAST)
    assert result["session_config"] == {"session.intra_op.allow_spinning": "0"}


def test_cpu_latency_fixed_batch_model_measured_at_its_batch(models) -> None:
    *_, directory = models
    model = conv_bn_residual()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 4
    fixed = save(model, directory / "fixed.onnx")
    result = cpu_latency(fixed, fixed, settings=FAST)  # synthetic inputs: every dimension is known
    assert result["batch_sizes"] == [4] and set(result["fp32"]) == {"batch_4"}
    _check(result["quantized"]["batch_4"], 4)
    assert any("fixes batch 4" in note for note in result["notes"])


def test_interleaved_runs_rotate_blocks_and_stop_at_the_budget_but_not_before_the_minimum() -> None:
    order: list[str] = []

    def slow() -> None:  # 20 ms a call: the warm-up's 10 ms end it after one round, BLOCK_S a block after one run
        order.append("slow")
        time.sleep(0.02)

    def fast() -> None:
        order.append("fast")

    slow_times, fast_times = interleaved_runs(
        [slow, fast], warmup=5, runs=50, min_runs=MIN_RUNS, budget_s=0.05, warmup_s=0.01
    )
    # 0.05 s pass in the third round; the slow call's MIN_RUNS still run, a block of the fast one's each round
    assert len(slow_times) == MIN_RUNS and len(fast_times) == MIN_RUNS * BLOCK_RUNS
    assert min(slow_times) >= 20.0 > max(fast_times)
    rounds = [["slow", *["fast"] * BLOCK_RUNS] if r % 2 == 0 else [*["fast"] * BLOCK_RUNS, "slow"] for r in range(5)]
    assert order == ["slow", "fast", *(name for block in rounds for name in block)]  # the order rotates
    order.clear()
    assert [len(t) for t in interleaved_runs([slow], warmup=2, runs=3, min_runs=5, budget_s=None)] == [3]
    assert len(order) == 5  # no budget: every warm-up round and run
    assert [len(t) for t in interleaved_runs([fast, fast], warmup=5, runs=50, min_runs=5, budget_s=5.0)] == [50, 50]
    enough = interleaved_runs([fast, fast], warmup=1, runs=50, min_runs=5, budget_s=None, enough=lambda t: True)
    assert [len(t) for t in enough] == [BLOCK_RUNS, BLOCK_RUNS]  # one round


def test_interleaved_runs_go_on_past_the_budget_while_extend_says_so_up_to_their_cap() -> None:
    def call() -> None:  # 20 ms: a block of one run
        time.sleep(0.02)

    asked: list[list[int]] = []

    def extend(times: list[list[float]]) -> bool:
        asked.append([len(t) for t in times])
        return len(times[0]) < 4

    times = interleaved_runs([call, call], warmup=0, runs=50, min_runs=2, budget_s=0.0, extend=extend)
    assert [len(t) for t in times] == [4, 4] and asked == [[2, 2], [3, 3], [4, 4]]  # asked once the budget stops them
    capped = interleaved_runs([call, call], warmup=0, runs=3, min_runs=2, budget_s=0.0, extend=lambda t: True)
    assert [len(t) for t in capped] == [3, 3]


def test_a_call_that_onnx_runtime_refuses_in_the_warm_up_gets_its_message_and_runs_no_more(models) -> None:
    """A model whose batch axis is fixed at 4, fed a batch of 2: ONNX Runtime's own error, while the other model
    is timed on."""
    *_, directory = models
    model = conv_bn_residual()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 4
    fixed = latency_session(str(save(model, directory / "fixed-4.onnx")), 1)
    dynamic = latency_session(str(save(conv_bn_residual(), directory / "dynamic.onnx")), 1)
    feeds = {"input": np.zeros((2, 3, 8, 8), np.float32)}
    refused, timed = interleaved_runs(
        [lambda: fixed.run(None, feeds), lambda: dynamic.run(None, feeds)], warmup=1, runs=6, min_runs=5, budget_s=None
    )
    assert isinstance(refused, str) and "input" in refused and len(timed) == 6


def test_latency_reports_runs_cut_by_the_budget(models) -> None:
    fp32, quantized, data, _ = models
    settings = LatencySettings(warmup=1, runs=10_000, budget_s=0.01, batch_sizes=(32,))
    progress = []
    result = cpu_latency(
        fp32, quantized, sample=data, settings=settings, monitor=Monitor(lambda *a: progress.append(a))
    )
    assert result["budget_s"] == 0.01
    assert MIN_RUNS <= result["fp32"]["batch_32"]["runs"] < 10_000
    assert any("0.01 s budget" in note for note in result["notes"])
    assert [(stage, fraction) for stage, fraction, _ in progress] == [("latency", 1.0)]
    assert result["quantized"]["batch_32"]["runs"] == result["fp32"]["batch_32"]["runs"]  # interleaved rounds
    with pytest.raises(Canceled):
        cpu_latency(fp32, quantized, sample=data, settings=settings, monitor=Monitor(should_cancel=lambda: True))


def test_feeds_repeat_sample_rows_and_refuse_unknown_dims() -> None:
    spec = InputSpec("x", np.dtype(np.float32), ("N", 2))
    sample = {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}
    feeds = feeds_for([spec], 5, sample)
    assert feeds["x"].shape == (5, 2) and np.array_equal(feeds["x"][3], sample["x"][0])
    with pytest.raises(InvalidDataError, match="symbolic"):
        feeds_for([InputSpec("t", np.dtype(np.int64), ("N", "seq"))], 2)


def test_settings_validate() -> None:
    with pytest.raises(ValueError, match="runs"):
        LatencySettings(runs=0)
    with pytest.raises(ValueError, match="batch_sizes"):
        LatencySettings(batch_sizes=(0,))
    with pytest.raises(ValueError, match="budget_s"):
        LatencySettings(budget_s=0)
