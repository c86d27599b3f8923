"""Comparing the CPU latency of a few variants of one model on a shared, noisy machine.

Protocol per batch size: one session per model (``cpu_latency.latency_session``: the deployed integer kernels, the
report's session options), ``WARMUP`` untimed runs each at the first batch size and one at each later one (it only
grows the arena), then rounds in which every model runs a block (up to ``cpu_latency.BLOCK_RUNS`` runs in a row,
one where a run takes 20 ms or more: ``cpu_latency.interleaved_runs``), the order rotated each round, so that load
from other processes falls on all models alike. Rounds stop once every model has ``RUNS`` runs, once ``budget_s``
seconds have passed and every model has ``MIN_RUNS``, or once every model has ``SEPARATED_RUNS`` and every two
models' times lie far apart (``separated``): every run of one more than ``SEPARATION`` times every run of the
other, but its slowest (``span``). Load from other processes lengthens a run and never shortens it, and so do a
batch size's first runs, which grow the arena: one run is let off. In a profile, smart-turn's quantized model ran
its first two batches of 32 at 825-841 and 1303-1344 ms, then 665-850 ms, FP32 at 1520 ms and more; magika's at
118 and 120 ms, then 73-79 ms (FP32 159-181 ms). Models within a few percent of each other never stop early, so a
close call (a quantized model 6 % faster at batch 1) gets its ``MIN_RUNS`` runs however bursty the load, while a
large model whose batch of 32 takes seconds, its quantized twin 1.7x faster, is not run seven times more than its
verdict needs (that would cost more than calibrating it).

Each model's times are summarized by their quartiles and span (``Timing``: min, p25, p50, p75, high in ms). Model
a is *clearly faster* than b at one batch size when a's p75 lies below b's p25 (their interquartile ranges, the
spread, do not overlap) and a's median is at least ``MIN_GAIN`` below b's; ``compare`` then weighs all batch
sizes: ``faster`` when a is clearly faster at one and clearly slower at none. Anything else is ``same``: a caller
that prefers one model unless another is clearly faster keeps its preference. ``no_slower`` is the test a promise
of "never slower than b" needs, since under load the spread can swallow a 2x gap between medians: a is clearly
slower at no batch size, and either its median is at most ``MIN_GAIN`` above b's at every batch size, or a is
clearly faster at one (a gain beyond the spread pays for a loss within it). That promise is given on
``conclusive`` timings only: a model whose batch of 32 ran twice under load read 12 % faster than FP32 and ran
1.4x slower. Conclusive are ``MIN_RUNS`` runs of each, or ``SEPARATED_RUNS`` lying far apart as above: the verdict
the early stop rests on. A caller whose rounds a budget cuts short (``node_profile``) goes on past it while
``within_reach``: the first model is the reference, and every other one's fastest run is faster than all of its
runs by ``SEPARATION``. Load lengthens runs, so the fastest runs foretell where two models settle, and a few more
runs would make that conclusive. A large model's profile that would stop at two runs of a batch of 32 then runs
four, and no whole-model comparison after it has to run seven.

``signature(model)`` identifies what the timing depends on (each node's op type, attributes, inputs
and outputs; each initializer's type and shape; the graph's inputs and outputs), not the weights' or
scales' values, so a cached timing (``quantcore.evaluate.latency_cache``) serves a rerun.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantcore.evaluate.cpu_latency import feeds_for, interleaved_runs, latency_session
from quantcore.runtime.batching import InputSpec
from quantcore.runtime.session import RUNTIME_ERRORS, runtime_message

WARMUP = 2
RUNS = 200  # at most, per model; small models get many runs within the budget, large ones MIN_RUNS
MIN_RUNS = 7  # per model before the budget may stop the rounds: quartiles of fewer runs are mostly noise
SEPARATED_RUNS = 4  # per model before times far apart stop the rounds (see module)
SEPARATION = 1.1  # far apart: the slower model's fastest run beyond this multiple of the faster's slowest
MIN_GAIN = 0.02  # a median 2 % lower at least: below that a difference is not worth a decision

# models (serialized) and batch sizes → per batch size, per model: its times in ms, or why it did not run
Timer = Callable[[Sequence[bytes], Sequence[int]], dict[int, list[list[float] | str]]]


@dataclass(frozen=True)
class Timing:
    """Quartiles and span of one model's times at one batch size (ms), and how many runs they summarize."""

    min_ms: float
    p25_ms: float
    p50_ms: float
    p75_ms: float
    high_ms: float  # the end of the runs' ``span``: the slowest but one of ``SEPARATED_RUNS`` or more
    runs: int

    @classmethod
    def of(cls, times_ms: Sequence[float]) -> Timing:
        if not times_ms:
            raise ValueError("no timings to summarize")
        p25, p50, p75 = (float(v) for v in np.percentile(np.asarray(times_ms, dtype=np.float64), (25, 50, 75)))
        low, high = span(times_ms)
        return cls(low, p25, p50, p75, high, len(times_ms))

    def to_dict(self) -> dict[str, Any]:
        return {
            "min_ms": self.min_ms,
            "p25_ms": self.p25_ms,
            "p50_ms": self.p50_ms,
            "p75_ms": self.p75_ms,
            "high_ms": self.high_ms,
            "runs": self.runs,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        fields = ("min_ms", "p25_ms", "p50_ms", "p75_ms", "high_ms")
        return cls(*(float(data[field]) for field in fields), int(data["runs"]))


def clearly_faster(a: Timing, b: Timing) -> bool:
    """True when ``a`` beats ``b`` beyond the spread (see module)."""
    return a.p75_ms < b.p25_ms and a.p50_ms <= b.p50_ms * (1.0 - MIN_GAIN)


def compare(a: Mapping[int, Timing], b: Mapping[int, Timing]) -> str:
    """``faster`` / ``slower`` / ``same``: model a against model b over the batch sizes both were timed at."""
    batches = sorted(set(a) & set(b))
    wins = any(clearly_faster(a[k], b[k]) for k in batches)
    losses = any(clearly_faster(b[k], a[k]) for k in batches)
    if wins and not losses:
        return "faster"
    if losses and not wins:
        return "slower"
    return "same"


def no_slower(a: Mapping[int, Timing], b: Mapping[int, Timing], *, trade: bool = True) -> bool:
    """True when ``a`` may stand in for ``b`` under a promise of "never slower than b", over the batch sizes
    both were timed at (see module). ``trade=False``: a gain beyond the spread does not pay for a loss
    within it (for a judgement on few runs, whose spread says little)."""
    batches = set(a) & set(b)
    if any(clearly_faster(b[k], a[k]) for k in batches):
        return False
    within = all(a[k].p50_ms <= b[k].p50_ms * (1.0 + MIN_GAIN) for k in batches)
    return within or (trade and any(clearly_faster(a[k], b[k]) for k in batches))


def conclusive(a: Mapping[int, Timing], b: Mapping[int, Timing]) -> bool:
    """Whether ``a`` and ``b`` were timed with enough runs for a verdict of "no slower" to rest on, at every batch
    size both were timed at, and at least one such batch size: ``MIN_RUNS`` of each, or ``SEPARATED_RUNS`` of
    each lying far apart (``separated``)."""

    def enough(x: Timing, y: Timing) -> bool:
        runs = min(x.runs, y.runs)
        return runs >= MIN_RUNS or (runs >= SEPARATED_RUNS and _apart([(x.min_ms, x.high_ms), (y.min_ms, y.high_ms)]))

    batches = set(a) & set(b)
    return bool(batches) and all(enough(a[k], b[k]) for k in batches)


def within_reach(times: Sequence[Sequence[float]]) -> bool:
    """Whether rounds cut short by their budget should go on for a conclusive verdict: some model has fewer than
    ``SEPARATED_RUNS`` runs, and every model after the first (the reference) has a run faster than every run of
    the first by more than ``SEPARATION`` (see module)."""
    if len(times) < 2 or not all(times) or min(map(len, times)) >= SEPARATED_RUNS:
        return False
    return all(SEPARATION * min(t) < min(times[0]) for t in times[1:])


def interleaved_times(
    models: Sequence[bytes],
    batch_sizes: Sequence[int],
    *,
    specs: Sequence[InputSpec],
    sample: Mapping[str, np.ndarray] | None,
    threads: int | None,
    budget_s: float = 0.5,
) -> dict[int, list[list[float] | str]]:
    """The default ``Timer``: each model's times at each batch size by the module's protocol (``budget_s``
    per batch size), or, for a model ONNX Runtime refuses to build or run, its message. Preconditions:
    the models share their inputs (``specs``; ``sample`` rows feed them, see ``cpu_latency.feeds_for``)."""
    sessions: list[Any] = []
    for model in models:
        try:
            sessions.append(latency_session(model, threads))
        except Exception as error:  # ONNX Runtime raises its own exception types
            sessions.append(runtime_message(error) if isinstance(error, RUNTIME_ERRORS) else str(error)[:400])
    live = [i for i, s in enumerate(sessions) if not isinstance(s, str)]
    result: dict[int, list[list[float] | str]] = {}
    for batch in batch_sizes:
        feeds = feeds_for(specs, batch, sample)
        measured = interleaved_runs(
            [lambda s=sessions[i], f=feeds: s.run(None, f) for i in live],
            warmup=WARMUP if batch == batch_sizes[0] else 1,
            runs=RUNS,
            min_runs=MIN_RUNS,
            budget_s=budget_s,
            enough=decided,
        )
        timed = iter(measured)  # in the order of ``live``
        result[batch] = [s if isinstance(s, str) else next(timed) for s in sessions]
    return result


def decided(times: Sequence[Sequence[float]], runs: int = SEPARATED_RUNS) -> bool:
    """Whether interleaved rounds may stop before their budget: every model has ``runs`` runs (``SEPARATED_RUNS``,
    a conclusive verdict, unless the caller needs more) and they lie far apart (``separated``)."""
    return min(map(len, times), default=0) >= runs and separated(times)


def separated(times: Sequence[Sequence[float]]) -> bool:
    """Whether at least two models ran and every two lie far apart: every run of the slower more than
    ``SEPARATION`` times every run of the faster, within their ``span``s."""
    return _apart(span(t) for t in times)


def span(times: Sequence[float]) -> tuple[float, float]:
    """A model's runs from the fastest to the slowest, or to the slowest but one where they number
    ``SEPARATED_RUNS`` or more (see module)."""
    ordered = sorted(times)
    return ordered[0], ordered[-2] if len(ordered) >= SEPARATED_RUNS else ordered[-1]


def _apart(spans: Iterable[tuple[float, float]]) -> bool:
    ordered = sorted(spans)
    return len(ordered) > 1 and all(
        low_next > SEPARATION * high for (_, high), (low_next, _) in itertools.pairwise(ordered)
    )


def signature(model: onnx.ModelProto) -> str:
    """SHA-256 of what ``model``'s timing depends on (see module)."""
    digest = hashlib.sha256()
    graph = model.graph
    for opset in model.opset_import:
        digest.update(f"opset|{opset.domain}|{opset.version}\n".encode())
    for value in (*graph.input, *graph.output):
        digest.update(f"io|{value.name}|{value.type.SerializeToString().hex()}\n".encode())
    for tensor in graph.initializer:
        digest.update(f"init|{tensor.name}|{tensor.data_type}|{tuple(tensor.dims)}\n".encode())
    for node in graph.node:
        attributes = [_attribute_text(a) for a in sorted(node.attribute, key=lambda a: a.name)]
        digest.update(
            f"node|{node.domain}|{node.op_type}|{list(node.input)}|{list(node.output)}|{attributes}\n".encode()
        )
    return digest.hexdigest()


def _attribute_text(attribute: onnx.AttributeProto) -> str:
    """An attribute by its value, a tensor attribute (a Constant's) by its type and shape only, a graph
    attribute by its nodes' signature."""
    if attribute.type == onnx.AttributeProto.TENSOR:
        return f"{attribute.name}=tensor{attribute.t.data_type}{tuple(attribute.t.dims)}"
    if attribute.type == onnx.AttributeProto.GRAPH:
        return f"{attribute.name}=graph{signature(onnx.helper.make_model(attribute.g))}"
    return f"{attribute.name}={onnx.helper.get_attribute_value(attribute)!r}"
