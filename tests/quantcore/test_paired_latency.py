"""``quantcore.evaluate.paired_latency``: models whose times lie far apart end the rounds early, twins run
their minimum; the separation rule itself on fixed times."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantcore.evaluate.cpu_latency import BLOCK_RUNS
from quantcore.evaluate.paired_latency import MIN_RUNS, SEPARATED_RUNS, interleaved_times, separated
from quantcore.runtime.batching import input_specs


def matmuls(count: int, rows: int = 64, width: int = 1024) -> onnx.ModelProto:
    """input (N, rows, width) → ``count`` chained MatMuls by a width x width weight → out: about
    N x count x 64 M multiply-adds at the defaults."""
    weight = numpy_helper.from_array(np.eye(width, dtype=np.float32) * 0.5, "w")
    names = ["input", *(f"t{i}" for i in range(count - 1)), "out"]
    nodes = [helper.make_node("MatMul", [names[i], "w"], [names[i + 1]], name=f"mm{i}") for i in range(count)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", rows, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", rows, width])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_separated_needs_every_pair_far_apart() -> None:
    assert separated([[1.0, 1.2, 1.1], [2.0, 2.5, 2.1]])
    assert separated([[5.0, 6.0], [1.0, 2.0], [3.0, 4.0]])
    assert not separated([[1.0, 2.1], [2.0, 3.0]])  # one run of the slower below one of the faster
    assert not separated([[1.0, 1.05], [1.1, 1.2]])  # apart, but by less than SEPARATION: a close call
    assert not separated([[1.0, 9.0], [2.0, 3.0], [10.0, 11.0]])  # a span containing another
    assert not separated([[1.0, 2.0]])  # a lone model has nothing to be apart from


def test_models_clearly_apart_stop_after_the_separated_rounds() -> None:
    # 64 M multiply-adds a run against 32 times that (about 1 against 100 ms on one thread here): a gap beyond
    # what the preemptions of a loaded machine add to a run (up to some 25 ms seen), so their times do not overlap
    light, heavy = matmuls(1), matmuls(32)
    specs = input_specs(light)
    timed = interleaved_times(
        [light.SerializeToString(), heavy.SerializeToString()],
        (1, 2),  # the second batch size has its own warm-up run
        specs=specs,
        sample=None,
        threads=1,
        budget_s=60.0,  # without the early stop, 200 rounds or a minute of them
    )
    for batch, (fast, slow) in timed.items():
        # a round runs the heavy model once (a block ends after BLOCK_S) and the light one up to BLOCK_RUNS times
        assert SEPARATED_RUNS <= len(slow) < MIN_RUNS and len(slow) <= len(fast) <= BLOCK_RUNS * len(slow), batch
        assert max(fast) < min(slow)


def test_a_spent_budget_stops_twins_at_the_minimum_of_runs() -> None:
    model = matmuls(1)  # about 1 ms a run: timer jitter is a small part of it
    serialized = model.SerializeToString()
    timed = interleaved_times([serialized] * 2, (1,), specs=input_specs(model), sample=None, threads=1, budget_s=0.0)
    # twins are never far apart: they run until the budget, spent at once, lets the minimum of runs stop them,
    # at the end of the round (a block of up to BLOCK_RUNS runs each) that reaches it
    assert all(MIN_RUNS <= len(times) < MIN_RUNS + BLOCK_RUNS for times in timed[1]), [len(t) for t in timed[1]]
