"""Candidates' deployed models timed against each other on this CPU, for the search's choices where the
deployment favours latency (``cpu_objective="latency"``): whether a base candidate is kept as the base
(``quantcore.auto.search``) and which of those that meet the objective is kept (``quantcore.auto.speed``).

How: ``paired_latency.interleaved_times`` (``default_timer``), at the config's ``cpu_batch_sizes`` (the
model's own batch where it fixes one) and ``cpu_threads``, on the selection samples, as the placement times
whole models; the verdicts are ``paired_latency.compare``'s. The models are timed before the final run's
placement, which only returns regions slower than float to float: a model clearly faster before it does not
become the slower after it.

Cost: the batch sizes are timed smallest first, each only where its runs fit the time the caller gives:
``WARMUP`` plus ``MIN_RUNS`` rounds of every model, or ``BUDGET_S`` if longer, at each model's seconds per
sample times the batch. Before any timing, a model's seconds per sample are ``Tried.sample_seconds`` (its
batch-1 latency where the candidates measured it, else its evaluate stage's seconds per selection sample,
which ran the FP32 and the quantized models on each: more than the deployed model alone takes); after one,
its median at the largest batch timed over that batch, which a larger batch does not exceed per sample on
a CPU's batched kernels. A batch size that does not fit is left out, and said so (``Timed.left_out``).

Models timed together once are not timed again in the same search (``Memo``, by their timing signatures,
``paired_latency.signature``): the base's comparison of the config as given with full int8 weights serves
the choice among the candidates that meet the objective where those are its two graphs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from quantcore.config import QuantizeConfig
from quantcore.evaluate.cpu_latency import fixed_batch, resolved_threads
from quantcore.evaluate.paired_latency import MIN_RUNS, WARMUP, Timer, Timing, interleaved_times, signature
from quantcore.runtime.batching import InputSpec

BUDGET_S = 0.5  # seconds of rounds per batch size at least: the placement's whole-model timings' (``RUN_S``)


@dataclass(frozen=True)
class Timed:
    """Each model's timings per batch size timed, or ONNX Runtime's message where it refused to run it;
    ``left_out``: why the larger batch sizes were not timed (None: all were); ``reused``: timed earlier in the
    search (``Memo``)."""

    batch_sizes: tuple[int, ...]
    threads: int
    timings: list[dict[int, Timing] | str]
    seconds: float  # of the timing runs
    left_out: str | None = None
    reused: bool = False

    def shown(self, i: int) -> dict[str, object]:
        """Model ``i``'s timings for the report: ``timings`` per ``batch_N``, ``error`` (None: it ran)."""
        timing = self.timings[i]
        if isinstance(timing, str):
            return {"timings": {}, "error": timing}
        return {"timings": {f"batch_{b}": t.to_dict() for b, t in timing.items()}, "error": None}


Memo = dict[frozenset[str], tuple[list[str], Timed]]  # signatures timed together -> (their order, the timing)


def p50_change(before: dict[int, Timing], after: dict[int, Timing]) -> str:
    """Median times from ``before`` to ``after`` at each batch size ``after`` was timed at, in words."""
    return ", ".join(f"{before[b].p50_ms:.3g} → {after[b].p50_ms:.3g} ms at batch {b}" for b in after)


def default_timer(specs: Sequence[InputSpec], sample: dict, threads: int) -> Timer:
    """``interleaved_times`` on ``sample`` (a test replaces it: the CPU's timings cannot be made to differ)."""

    def timer(models: Sequence[bytes], batches: Sequence[int]) -> dict[int, list[list[float] | str]]:
        return interleaved_times(models, batches, specs=specs, sample=sample, threads=threads, budget_s=BUDGET_S)

    return timer


def time_models(
    models: Sequence[str | Path],
    sample_seconds: Sequence[float],
    specs: Sequence[InputSpec],
    config: QuantizeConfig,
    seconds_left: float,
    sample: dict,
    memo: Memo,
) -> Timed | str:
    """``models`` timed as the module says, on ``sample``, within ``seconds_left``, or why none of their batch
    sizes fitted."""
    protos = [onnx.load(str(m)) for m in models]
    signatures = [signature(proto) for proto in protos]
    earlier = memo.get(frozenset(signatures))
    if earlier is not None and len(set(signatures)) == len(signatures):
        order, timed = earlier
        return replace(timed, timings=[timed.timings[order.index(s)] for s in signatures], seconds=0.0, reused=True)
    fixed = fixed_batch(specs)
    batches = (fixed,) if fixed is not None else tuple(sorted(config.cpu_batch_sizes))
    threads = resolved_threads(config.cpu_threads)
    timer = default_timer(specs, sample, threads)
    serialized = [proto.SerializeToString() for proto in protos]
    per_sample = list(sample_seconds)
    raw: dict[int, list[list[float] | str]] = {}
    left_out = None
    started = time.perf_counter()
    for batch in batches:
        estimate = max(BUDGET_S, (WARMUP + MIN_RUNS) * batch * sum(per_sample))
        left = seconds_left - (time.perf_counter() - started)
        if estimate > left:
            left_out = f"{estimate:.1f} s of timing runs at batch {batch} do not fit the {max(left, 0.0):.1f} s left"
            break
        raw[batch] = timer(serialized, (batch,))[batch]
        per_sample = [
            s if isinstance(times, str) else float(np.median(times)) / 1000.0 / batch
            for s, times in zip(per_sample, raw[batch], strict=True)
        ]
    if not raw:
        return left_out or "no batch size to time"
    timings: list[dict[int, Timing] | str] = []
    for i in range(len(models)):
        refused = next((times[i] for times in raw.values() if isinstance(times[i], str)), None)
        timings.append(refused if refused is not None else {b: Timing.of(times[i]) for b, times in raw.items()})
    timed = Timed(tuple(raw), threads, timings, time.perf_counter() - started, left_out)
    if len(set(signatures)) == len(signatures):
        memo[frozenset(signatures)] = (signatures, timed)
    return timed
