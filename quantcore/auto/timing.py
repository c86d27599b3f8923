"""Candidates' deployed models timed against each other on this CPU, for the search's choices where the
deployment favours latency (``cpu_objective="latency"``): whether a base candidate is kept as the base
(``quantcore.auto.search``) and which of those that meet the objective is kept (``quantcore.auto.speed``).

How: ``paired_latency.interleaved_times`` (``default_timer``), at the config's ``cpu_batch_sizes`` (the
model's own batch where it fixes one) and ``cpu_threads``, on the selection samples, as the placement times
whole models; the verdicts are ``paired_latency.compare``'s. The models are timed before the final run's
placement, which only returns regions slower than float to float: a model clearly faster before it does not
become the slower after it.

Cost: per batch size, ``WARMUP`` plus ``MIN_RUNS`` rounds of every model, or ``BUDGET_S`` if longer, at each
model's seconds per sample (``Tried.sample_seconds``: its batch-1 latency where the candidates measured it,
else its evaluate stage's seconds per selection sample, which ran the FP32 and the quantized models on each:
more than the deployed model alone takes) times the batch. Nothing is timed where that estimate does not fit
the time the caller gives.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from quantcore.config import QuantizeConfig
from quantcore.evaluate.cpu_latency import fixed_batch, resolved_threads
from quantcore.evaluate.paired_latency import MIN_RUNS, WARMUP, Timer, Timing, interleaved_times
from quantcore.runtime.batching import InputSpec

BUDGET_S = 0.5  # seconds of rounds per batch size at least: the placement's whole-model timings' (``RUN_S``)


@dataclass(frozen=True)
class Timed:
    """Each model's timings per batch size, or ONNX Runtime's message where it refused to run it."""

    batch_sizes: tuple[int, ...]
    threads: int
    timings: list[dict[int, Timing] | str]
    seconds: float  # of the timing runs

    def shown(self, i: int) -> dict[str, object]:
        """Model ``i``'s timings for the report: ``timings`` per ``batch_N``, ``error`` (None: it ran)."""
        timing = self.timings[i]
        if isinstance(timing, str):
            return {"timings": {}, "error": timing}
        return {"timings": {f"batch_{b}": t.to_dict() for b, t in timing.items()}, "error": None}


def batch_sizes(specs: Sequence[InputSpec], config: QuantizeConfig) -> tuple[int, ...]:
    fixed = fixed_batch(specs)
    return (fixed,) if fixed is not None else tuple(config.cpu_batch_sizes)


def default_timer(specs: Sequence[InputSpec], sample: dict, threads: int) -> Timer:
    """``interleaved_times`` on ``sample`` (a test replaces it: the CPU's timings cannot be made to differ)."""

    def timer(models: Sequence[bytes], batches: Sequence[int]) -> dict[int, list[list[float] | str]]:
        return interleaved_times(models, batches, specs=specs, sample=sample, threads=threads, budget_s=BUDGET_S)

    return timer


def estimate_seconds(sample_seconds: Sequence[float], batches: Sequence[int]) -> float:
    """The timing runs' seconds, as the module says."""
    return sum(max(BUDGET_S, (WARMUP + MIN_RUNS) * batch * sum(sample_seconds)) for batch in batches)


def time_models(
    models: Sequence[str | Path],
    sample_seconds: Sequence[float],
    specs: Sequence[InputSpec],
    config: QuantizeConfig,
    seconds_left: float,
    sample: dict,
) -> Timed | str:
    """``models`` timed as the module says, on ``sample``, or why they were not: the estimate did not fit
    ``seconds_left``."""
    batches = batch_sizes(specs, config)
    threads = resolved_threads(config.cpu_threads)
    estimate = estimate_seconds(sample_seconds, batches)
    if estimate > seconds_left:
        return f"{estimate:.1f} s of timing runs do not fit the {max(seconds_left, 0.0):.1f} s left for them"
    timer = default_timer(specs, sample, threads)
    started = time.perf_counter()
    raw = timer([onnx.load(str(m)).SerializeToString() for m in models], batches)
    timings: list[dict[int, Timing] | str] = []
    for i in range(len(models)):
        refused = next((times[i] for times in raw.values() if isinstance(times[i], str)), None)
        timings.append(refused if refused is not None else {b: Timing.of(raw[b][i]) for b in batches})
    return Timed(batches, threads, timings, time.perf_counter() - started)
