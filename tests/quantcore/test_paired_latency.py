"""``quantcore.evaluate.paired_latency``: models whose times lie far apart end the rounds early, twins run
their minimum; the separation rule, the verdict it gives and when a few more runs could give it, on fixed times."""

from __future__ import annotations

from quantcore.evaluate.cpu_latency import BLOCK_RUNS
from quantcore.evaluate.paired_latency import (
    MIN_RUNS,
    SEPARATED_RUNS,
    Timing,
    conclusive,
    interleaved_times,
    separated,
    span,
    within_reach,
)
from quantcore.runtime.batching import input_specs
from tests.quantcore.models import matmuls


def test_separated_needs_every_pair_far_apart() -> None:
    assert separated([[1.0, 1.2, 1.1], [2.0, 2.5, 2.1]])
    assert separated([[5.0, 6.0], [1.0, 2.0], [3.0, 4.0]])
    assert not separated([[1.0, 2.1], [2.0, 3.0]])  # one run of the slower below one of the faster
    assert not separated([[1.0, 1.05], [1.1, 1.2]])  # apart, but by less than SEPARATION: a close call
    assert not separated([[1.0, 9.0], [2.0, 3.0], [10.0, 11.0]])  # a span containing another
    assert not separated([[1.0, 2.0]])  # a lone model has nothing to be apart from


def test_of_four_runs_or_more_the_slowest_is_let_off() -> None:
    """Load lengthens runs, and a batch size's first runs grow the arena (smart-turn's quantized model: 841 and
    1303 ms, then 665-680, against FP32's 1520 and more): one slow run does not keep models apart from a verdict,
    two do. Here the second run is slower still, 1450 ms: apart from FP32's runs only once it is let off."""
    quantized, fp32 = [841.0, 1450.0, 670.0, 665.0], [1716.0, 2121.0, 1523.0, 1521.0]
    assert span(quantized) == (665.0, 841.0) and span(quantized[:3]) == (670.0, 1450.0)
    assert separated([fp32, quantized]) and not separated([fp32[:3], quantized[:3]])
    assert not separated([fp32, [841.0, 1450.0, 1400.0, 665.0]])  # two slow runs: the second is not let off
    assert conclusive({32: Timing.of(quantized)}, {32: Timing.of(fp32)})
    assert Timing.of(quantized).high_ms == 841.0 and Timing.of(quantized).min_ms == 665.0


def test_a_verdict_rests_on_the_minimum_of_runs_or_on_fewer_far_apart() -> None:
    fp32_4, fast_4 = Timing.of([10.0, 11.0, 12.0, 13.0]), Timing.of([5.0, 6.0, 7.0, 9.0])  # 10 > 1.1 x 9
    assert SEPARATED_RUNS == 4 and conclusive({1: fast_4}, {1: fp32_4}) and conclusive({1: fp32_4}, {1: fast_4})
    close_4 = Timing.of([5.0, 6.0, 9.5, 9.6])  # 10 < 1.1 x 9.5, the slowest let off: a close call needs its MIN_RUNS
    assert not conclusive({1: close_4}, {1: fp32_4})
    fp32_7, close_7 = Timing.of([10.0, 11.0, 12.0, 13.0] * 2), Timing.of([5.0, 6.0, 9.5, 9.6] * 2)
    assert MIN_RUNS <= 8 and conclusive({1: close_7}, {1: fp32_7})
    fast_3 = Timing.of([5.0, 6.0, 7.0])  # far apart, but three runs
    assert not conclusive({1: fast_3}, {1: fp32_4})
    assert not conclusive({1: fast_4, 32: fast_3}, {1: fp32_4, 32: fp32_4})  # every batch size must be
    assert not conclusive({1: fast_4}, {32: fp32_4})  # no batch size timed for both


def test_rounds_go_on_for_a_verdict_only_where_every_model_ran_far_faster_than_the_first() -> None:
    """By each model's fastest run: load lengthens runs, and a batch size's first runs grow the arena (smart-turn's
    quantized model, a batch of 32: about 900 and 1860 ms, then 670-680 against FP32's 1520 and more)."""
    assert within_reach([[10.0, 12.0], [5.0, 9.0]])  # two runs each, 10 > 1.1 x 5
    assert within_reach([[2100.0, 2300.0], [900.0, 1860.0]])  # 1860 is a warm-up: the fastest runs are 2.3x apart
    assert within_reach([[10.0, 12.0], [5.0, 9.0], [2.0, 3.0]])
    assert not within_reach([[5.0, 9.0], [10.0, 12.0]])  # the first faster: no verdict of "no slower" to reach
    assert not within_reach([[10.0, 12.0], [9.5, 9.6]])  # too close: 10 < 1.1 x 9.5
    assert not within_reach([[10.0, 12.0], [5.0, 9.0], [11.0, 11.5]])  # one of them is not
    assert not within_reach([[10.0, 11.0, 12.0, 13.0], [5.0, 6.0, 7.0, 8.0]])  # reached: enough runs
    assert not within_reach([[10.0, 12.0]]) and not within_reach([[10.0, 12.0], []])


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
