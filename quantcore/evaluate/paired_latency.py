"""Comparing the CPU latency of a few variants of one model on a shared, noisy machine.

Protocol per batch size: one session per model (``cpu_latency.latency_session``: the deployed integer kernels,
the report's session options), ``WARMUP`` untimed runs each at the first batch size and one at each later one
(it only grows the arena), then rounds in which every model runs a block (up to ``cpu_latency.BLOCK_RUNS``
runs in a row, one where a run takes 20 ms or more: ``cpu_latency.interleaved_runs``), the order rotated each
round, so that load from other processes falls on all models alike. Rounds stop once every model has ``RUNS``
runs, once ``budget_s`` seconds have passed and every model has ``MIN_RUNS``, or once every model has
``SEPARATED_RUNS`` and every two models' times lie far apart (``separated``): every run of one more than
``SEPARATION`` times every run of the other. Models within a few percent of each other never stop early, so a
close call (a quantized model 6 % faster at batch 1) gets its ``MIN_RUNS`` runs however bursty the load, while
a large model whose batch of 32 takes seconds, its quantized twin 1.7x faster, is not run seven times more
than its verdict needs (that would cost more than calibrating it).

Each model's times are summarized by their quartiles (``Timing``: p25, p50, p75 in ms). Model a is
*clearly faster* than b at one batch size when a's p75 lies below b's p25 (their interquartile ranges,
the spread, do not overlap) and a's median is at least ``MIN_GAIN`` below b's; ``compare`` then weighs
all batch sizes: ``faster`` when a is clearly faster at one and clearly slower at none. Anything else
is ``same``: a caller that prefers one model unless another is clearly faster keeps its preference.
``no_slower`` is the test a promise of "never slower than b" needs, since under load the spread can
swallow a 2x gap between medians: a is clearly slower at no batch size, and either its median is at
most ``MIN_GAIN`` above b's at every batch size, or a is clearly faster at one (a gain beyond the
spread pays for a loss within it). That promise is given on ``conclusive`` timings only: a model whose batch of
32 ran twice under load read 12 % faster than FP32 and ran 1.4x slower.

``signature(model)`` identifies what the timing depends on (each node's op type, attributes, inputs
and outputs; each initializer's type and shape; the graph's inputs and outputs), not the weights' or
scales' values, so a cached timing (``quantcore.evaluate.latency_cache``) serves a rerun.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
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
    """Quartiles of one model's times at one batch size (ms), and how many runs they summarize."""

    p25_ms: float
    p50_ms: float
    p75_ms: float
    runs: int

    @classmethod
    def of(cls, times_ms: Sequence[float]) -> Timing:
        if not times_ms:
            raise ValueError("no timings to summarize")
        p25, p50, p75 = (float(v) for v in np.percentile(np.asarray(times_ms, dtype=np.float64), (25, 50, 75)))
        return cls(p25, p50, p75, len(times_ms))

    def to_dict(self) -> dict[str, Any]:
        return {"p25_ms": self.p25_ms, "p50_ms": self.p50_ms, "p75_ms": self.p75_ms, "runs": self.runs}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        return cls(float(data["p25_ms"]), float(data["p50_ms"]), float(data["p75_ms"]), int(data["runs"]))


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
    """Whether ``a`` and ``b`` were timed with enough runs for a verdict of "no slower" to rest on: ``MIN_RUNS``
    of each at every batch size both were timed at, and at least one such batch size."""
    batches = set(a) & set(b)
    return bool(batches) and all(min(a[k].runs, b[k].runs) >= MIN_RUNS for k in batches)


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
            enough=lambda runs: min(map(len, runs), default=0) >= SEPARATED_RUNS and separated(runs),
        )
        timed = iter(measured)  # in the order of ``live``
        result[batch] = [s if isinstance(s, str) else next(timed) for s in sessions]
    return result


def separated(times: Sequence[Sequence[float]]) -> bool:
    """Whether at least two models ran and every two lie far apart: every run of the slower more than
    ``SEPARATION`` times every run of the faster."""
    spans = sorted((min(t), max(t)) for t in times)
    return len(spans) > 1 and all(
        low_next > SEPARATION * high for (_, high), (low_next, _) in itertools.pairwise(spans)
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
