"""Per-node kernel times of one model on ONNX Runtime's CPU EP, read from its profiler.

The model runs in the session every CPU latency measurement runs in (``cpu_latency.latency_session``:
the deployed integer kernels, the same threads), with ``enable_profiling`` on and the optimized graph
written beside the profile, because a profiled node is a node of the *optimized* graph: ONNX Runtime's
fusions rename nodes (a QLinearConv fused from DequantizeLinear → Conv → QuantizeLinear is named
``<Conv's name>_token_<n>``, an NCHWc Conv ``<its output tensor>_nchwc``) and add layout nodes of their
own (``Transpose``, ``ReorderInput``, ``ReorderOutput``). The optimized graph gives each profiled node
its input and output tensors, by which ``quantcore.analysis.region_costs`` maps it back. Each run's
``model_run`` duration is kept too: the models are profiled interleaved, so their runs compare as
``paired_latency.interleaved_times``'s do (the profiler's own cost, a few µs per node, falls on the model with
more nodes: a quantized model's Q/DQ make it look, if anything, slower).

Protocol per batch size, the models compared interleaved (one session each): at the first batch size one
untimed run (a session's first run initializes its kernels and is several times slower), then ``MIN_RUNS``
to ``RUNS`` runs, all profiled; a node's time is the median of its kernel times over those runs (µs), the
run's time the median of the profiler's ``model_run`` durations. A later batch size's first run only
grows the arena, which the median of at least ``MIN_RUNS`` runs shrugs off: untimed, it would be a fourth
of the profile of a model whose batch of 32 takes seconds. With intra-op
threads each kernel's time is its wall clock, so the nodes' times add up to nearly the run's; what is
left is the executor's own overhead.
"""

from __future__ import annotations

import bisect
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.evaluate.cpu_latency import feeds_for, latency_session
from quantcore.runtime.batching import InputSpec
from quantcore.runtime.session import RUNTIME_ERRORS, runtime_message

RUNS = 5  # timed runs per batch size, at most
MIN_RUNS = 3  # at least: the median of three shrugs off one preempted run
KERNEL_SUFFIX = "_kernel_time"

# models (serialized) and batch sizes → per model, per batch size its profile, or why ONNX Runtime did not run it
Profiler = Callable[[Sequence[bytes], Sequence[int]], "list[dict[int, NodeProfile] | str]"]


@dataclass(frozen=True)
class ProfiledNode:
    """One node of the optimized graph: its name and op type as ONNX Runtime reports them, its tensors, and
    its median kernel time (µs)."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    us: float


@dataclass(frozen=True)
class NodeProfile:
    """One model at one batch size: its profiled nodes in the optimized graph's order and each timed run's
    duration (µs), in the order run: the whole-model timing of the runs the node medians are of."""

    nodes: tuple[ProfiledNode, ...]
    run_times_us: tuple[float, ...]

    @property
    def run_us(self) -> float:
        """The median run."""
        return float(statistics.median(self.run_times_us))

    @property
    def runs(self) -> int:
        return len(self.run_times_us)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [[n.name, n.op_type, list(n.inputs), list(n.outputs), n.us] for n in self.nodes],
            "run_times_us": list(self.run_times_us),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeProfile:
        nodes = tuple(
            ProfiledNode(str(name), str(op), tuple(inputs), tuple(outputs), float(us))
            for name, op, inputs, outputs, us in data["nodes"]
        )
        return cls(nodes, tuple(float(t) for t in data["run_times_us"]))


def profile_nodes(
    models: Sequence[bytes],
    batch_sizes: Sequence[int],
    *,
    specs: Sequence[InputSpec],
    sample: Mapping[str, np.ndarray] | None,
    threads: int | None,
    budget_s: float | None = None,
) -> list[dict[int, NodeProfile] | str]:
    """The default ``Profiler``: each model's profile at each batch size by the module's protocol, or, for a
    model ONNX Runtime refuses to build, run or profile, its message. The models' runs are interleaved (each
    round runs every model once, the order rotated), so that load from other processes falls on all alike
    and their profiles compare; a batch size's rounds stop at ``RUNS``, or after ``MIN_RUNS`` once its timed
    rounds took ``budget_s`` seconds. Preconditions as ``paired_latency.interleaved_times``'s (``specs``,
    ``sample``)."""
    with tempfile.TemporaryDirectory(prefix="quantcore-profile-") as scratch:
        directories = [Path(scratch) / str(i) for i in range(len(models))]
        sessions: list[Any] = []
        for model, directory in zip(models, directories, strict=True):
            directory.mkdir()
            try:
                sessions.append(latency_session(model, threads, profile_to=directory))
            except Exception as error:  # ONNX Runtime raises its own exception types
                sessions.append(runtime_message(error) if isinstance(error, RUNTIME_ERRORS) else str(error)[:400])
        live = [i for i, session in enumerate(sessions) if not isinstance(session, str)]
        counts = []  # timed rounds per batch size
        for position, batch in enumerate(batch_sizes):
            feeds = feeds_for(specs, batch, sample)
            untimed = 1 if position == 0 else 0
            started = time.perf_counter()
            for round_index in range(untimed + RUNS):
                shift = round_index % max(len(live), 1)
                for i in live[shift:] + live[:shift]:  # rotated: no model always runs first
                    try:
                        sessions[i].run(None, feeds)
                    except RUNTIME_ERRORS as error:
                        sessions[i] = runtime_message(error)
                live = [i for i in live if not isinstance(sessions[i], str)]
                timed = round_index + 1 - untimed
                if timed == 0:
                    started = time.perf_counter()  # the untimed round does not count against the budget
                elif timed >= MIN_RUNS and budget_s is not None and time.perf_counter() - started >= budget_s:
                    break
            counts.append(timed)
        return [
            session if isinstance(session, str) else _read(session, directory, batch_sizes, counts)
            for session, directory in zip(sessions, directories, strict=True)
        ]


def _read(
    session: Any, directory: Path, batch_sizes: Sequence[int], counts: Sequence[int]
) -> dict[int, NodeProfile] | str:
    """The profile ``session`` wrote into ``directory``, parsed (``_parse``)."""
    try:
        events = json.loads(Path(session.end_profiling()).read_text())
        optimized = onnx.load(str(directory / "optimized.onnx"), load_external_data=False)
    except (OSError, ValueError) as error:  # no profile file or optimized graph was written
        return f"no profile: {str(error)[:300]}"
    return _parse(events, optimized.graph, batch_sizes, counts)


def _parse(
    events: list[dict[str, Any]], graph: onnx.GraphProto, batch_sizes: Sequence[int], counts: Sequence[int]
) -> dict[int, NodeProfile] | str:
    """Split the profiler's events into its ``model_run``s (a node event lies inside its run's span), drop the
    first batch size's untimed run, and take the medians over each batch size's ``counts`` timed runs."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    expected = 1 + sum(counts)
    if len(spans) != expected:
        return f"the profile holds {len(spans)} runs, not {expected}"
    starts = [start for start, _ in spans]
    per_run: list[dict[str, float]] = [{} for _ in spans]  # run → node name → kernel µs
    op_types: dict[str, str] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith(KERNEL_SUFFIX):
            continue
        name = event["name"].removesuffix(KERNEL_SUFFIX)
        run = bisect.bisect_right(starts, event["ts"]) - 1
        if run >= 0:
            per_run[run][name] = per_run[run].get(name, 0.0) + float(event["dur"])
            op_types[name] = event.get("args", {}).get("op_name", "")
    tensors = {node.name: (tuple(node.input), tuple(node.output)) for node in graph.node}
    order = {name: position for position, name in enumerate(tensors)}
    result = {}
    first = 1  # the batch size's first timed run
    for batch, count in zip(batch_sizes, counts, strict=True):
        timed = range(first, first + count)
        first += count
        names = sorted({name for run in timed for name in per_run[run]}, key=lambda n: order.get(n, len(order)))
        nodes = tuple(
            ProfiledNode(
                name,
                op_types[name],
                *tensors.get(name, ((), ())),
                statistics.median(per_run[run].get(name, 0.0) for run in timed),
            )
            for name in names
        )
        result[batch] = NodeProfile(nodes, tuple(float(spans[run][1] - spans[run][0]) for run in timed))
    return result
