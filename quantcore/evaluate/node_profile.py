"""Per-node kernel times of one model on ONNX Runtime's CPU EP, read from its profiler.

The model runs in the session every CPU latency measurement runs in (``cpu_latency.latency_session``:
the deployed integer kernels, the same threads), with ``enable_profiling`` on and the optimized graph
written beside the profile, because a profiled node is a node of the *optimized* graph: ONNX Runtime's
fusions rename nodes (a QLinearConv fused from DequantizeLinear → Conv → QuantizeLinear is named
``<Conv's name>_token_<n>``, an NCHWc Conv ``<its output tensor>_nchwc``) and add layout nodes of their
own (``Transpose``, ``ReorderInput``, ``ReorderOutput``). The optimized graph gives each profiled node
its input and output tensors, by which ``quantcore.analysis.region_costs`` maps it back. Each run's
duration is kept too: the models are profiled interleaved, so their runs compare as
``paired_latency.interleaved_times``'s do. But the profiler's own cost, about ``PROFILER_NODE_US`` per node
and run, falls on the model with more nodes, and on a short run it is most of the run: ocr-cls's FP32 model
(238 nodes) and its quantized one (190) ran 1.95 and 2.06 ms per run profiled at batch 1, 0.58 and 0.81 ms
unprofiled, so the profile read as even a model that ran at 0.72x FP32's speed. Where that cost could reach
``paired_latency.MIN_GAIN`` of a run (the optimized graph's nodes, its subgraphs' included, x
``PROFILER_NODE_US`` above that share of its median), the run durations are taken from unprofiled runs instead,
made in the same sessions once profiling has ended.

Protocol per batch size, the models compared interleaved (one session each): at the first batch size one untimed run
(a session's first run initializes its kernels and is several times slower), then ``MIN_RUNS`` to ``RUNS`` runs, all
profiled; a node's time is the lower median of its kernel times over those runs (µs), the run's time the median of
the profiler's ``model_run`` durations. Other processes' load and a later batch size's first run (it only grows the
arena; untimed, it would be a third of the profile of a model whose batch of 32 takes seconds) lengthen a kernel and
never shorten it, so of two runs the shorter is the one to keep: two are the least. A third round would cost the
most where the budget can least afford it: the first profile, always made, runs two models at batch 32, and its
third round alone runs half as many samples as a calibration of 128. Unless the profile could be a verdict: a caller
comparing a model against a reference passes ``extend`` (``paired_latency.within_reach``), and the rounds go on past
the budget while it holds of the runs' wall-clock times, so that a quantized model far faster than FP32 gets the
runs (four of each) that settle it without a whole-model comparison after the profile; not where the profiler's cost
already weighs on the runs made (the same test on them), whose durations the unprofiled runs will replace. The
unprofiled runs, at the batch sizes that need them, are interleaved as the latency stage's
(``cpu_latency.interleaved_runs``: one untimed round, then blocks of runs in a row, ``MIN_RUNS`` and on to
``UNPROFILED_RUNS`` of each model until the batch size's seconds have passed, or until the models lie far apart
with ``paired_latency.MIN_RUNS`` runs each): being short, they cost little, and where the whole-run times are read as
a verdict (a placed model no slower than FP32) five runs of a 50 µs model are no evidence, while runs far apart are
one (magika's batch of 1 ran 21 to 50 unprofiled runs of each model until its budget was spent, a quarter to half a
second, where its quantized model ran 1.7x faster). Four far apart would settle the verdict, but the placement also
weighs a later profile's median against the first's, and four runs are one block of runs in a row: stopped at four,
khmer-seg's placed model passed that test and ran 7 % slower than the fully quantized one.
``NodeProfile.timed_us`` counts them with the profiled runs they replace. With intra-op threads each kernel's time
is its wall clock, so the nodes' times add up to nearly the run's; what is left is the executor's own overhead.
"""

from __future__ import annotations

import bisect
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantcore.evaluate import paired_latency
from quantcore.evaluate.cpu_latency import feeds_for, interleaved_runs, latency_session
from quantcore.evaluate.paired_latency import MIN_GAIN, decided
from quantcore.graph.index import node_subgraphs
from quantcore.runtime.batching import InputSpec
from quantcore.runtime.session import RUNTIME_ERRORS, runtime_message

RUNS = 5  # timed runs per batch size, at most
MIN_RUNS = 2  # at least: a node's lower median of two is its unpreempted run (see module)
UNPROFILED_RUNS = 50  # at most, of the unprofiled runs that replace short profiled ones
KERNEL_SUFFIX = "_kernel_time"
PROFILER_NODE_US = 5.0  # the profiler's cost per node and run: ocr-cls's quantized model, 2.06 - 0.81 ms over 190 nodes

# models (serialized) and batch sizes → per model, per batch size its profile, or why ONNX Runtime did not run it
Profiler = Callable[[Sequence[bytes], Sequence[int]], "list[dict[int, NodeProfile] | str]"]


@dataclass(frozen=True)
class ProfiledNode:
    """One node of the optimized graph: its name and op type as ONNX Runtime reports them, its tensors, and
    its lower median kernel time (µs)."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    us: float


@dataclass(frozen=True)
class NodeProfile:
    """One model at one batch size: its profiled nodes in the optimized graph's order and each timed run's
    duration (µs), in the order run: the whole-model timing of the runs the node medians are of, or of as many
    unprofiled runs where the profiler's cost would weigh on them (see module)."""

    nodes: tuple[ProfiledNode, ...]
    run_times_us: tuple[float, ...]
    timed_us: float  # every timed run made for this profile (profiled, and unprofiled where they replace them)

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
            "timed_us": self.timed_us,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeProfile:
        nodes = tuple(
            ProfiledNode(str(name), str(op), tuple(inputs), tuple(outputs), float(us))
            for name, op, inputs, outputs, us in data["nodes"]
        )
        return cls(nodes, tuple(float(t) for t in data["run_times_us"]), float(data["timed_us"]))


def profile_nodes(
    models: Sequence[bytes],
    batch_sizes: Sequence[int],
    *,
    specs: Sequence[InputSpec],
    sample: Mapping[str, np.ndarray] | None,
    threads: int | None,
    budget_s: float | None = None,
    extend: Callable[[list[list[float]]], bool] | None = None,
) -> list[dict[int, NodeProfile] | str]:
    """The default ``Profiler``: each model's profile at each batch size by the module's protocol, or, for a
    model ONNX Runtime refuses to build, run or profile, its message. The models' runs are interleaved (each
    round runs every model once, the order rotated), so that load from other processes falls on all alike
    and their profiles compare; a batch size's rounds stop at ``RUNS``, or after ``MIN_RUNS`` once its timed
    rounds took ``budget_s`` seconds, unless ``extend`` says to go on (asked of each live model's wall-clock ms,
    in the models' order; the unprofiled runs likewise). Preconditions as ``paired_latency.interleaved_times``'s
    (``specs``, ``sample``)."""
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
        graphs = [_optimized(directory) for directory in directories]  # written when its session was made
        nodes = [0 if isinstance(graph, str) else _node_count(graph) for graph in graphs]
        counts = []  # timed rounds per batch size
        for position, batch in enumerate(batch_sizes):
            feeds = feeds_for(specs, batch, sample)
            untimed = 1 if position == 0 else 0
            started = time.perf_counter()
            walls: dict[int, list[float]] = {i: [] for i in live}  # ms of each timed run, for ``extend``
            for round_index in range(untimed + RUNS):
                shift = round_index % max(len(live), 1)
                for i in live[shift:] + live[:shift]:  # rotated: no model always runs first
                    try:
                        begun = time.perf_counter()
                        sessions[i].run(None, feeds)
                        walls[i].append((time.perf_counter() - begun) * 1000.0)
                    except RUNTIME_ERRORS as error:
                        sessions[i] = runtime_message(error)
                live = [i for i in live if not isinstance(sessions[i], str)]
                timed = round_index + 1 - untimed
                if timed == 0:
                    started = time.perf_counter()  # the untimed round does not count against the budget
                    walls = {i: [] for i in live}
                    continue
                spent = timed >= MIN_RUNS and budget_s is not None and time.perf_counter() - started >= budget_s
                if spent and (extend is None or _weighs(nodes, walls) or not extend([walls[i] for i in live])):
                    break  # extended runs would be no verdict where unprofiled ones replace them
            counts.append(timed)
        profiles = [
            session if isinstance(session, str) else _read(session, graph, batch_sizes, counts)
            for session, graph in zip(sessions, graphs, strict=True)
        ]
        for batch in batch_sizes:
            runs = {i: p[batch].run_times_us for i, p in enumerate(profiles) if not isinstance(p, str) and batch in p}
            if _weighs(nodes, {i: [us / 1000.0 for us in times] for i, times in runs.items()}):
                feeds = feeds_for(specs, batch, sample)
                clean = interleaved_runs(
                    [lambda s=sessions[i], f=feeds: s.run(None, f) for i in live],
                    warmup=1,
                    runs=UNPROFILED_RUNS,
                    min_runs=MIN_RUNS,
                    budget_s=budget_s,
                    # MIN_RUNS, not four: a later profile's median is weighed against this one (see module)
                    enough=functools.partial(decided, runs=paired_latency.MIN_RUNS),
                    extend=extend,
                )
                for i, ms in zip(live, clean, strict=True):
                    if isinstance(ms, str):
                        continue  # a session that fails now: its profile stands
                    times = [t * 1000.0 for t in ms]
                    if not isinstance(profiles[i], str) and batch in profiles[i]:
                        profile = profiles[i][batch]
                        profiles[i][batch] = replace(
                            profile, run_times_us=tuple(times), timed_us=profile.timed_us + sum(times)
                        )
        return profiles


def _optimized(directory: Path) -> onnx.GraphProto | str:
    """The optimized graph a profiled session wrote into ``directory``, or why there is none."""
    try:
        return onnx.load(str(directory / "optimized.onnx"), load_external_data=False).graph
    except (OSError, ValueError) as error:  # no session was made, or it wrote no optimized graph
        return f"no profile: {str(error)[:300]}"


def _node_count(graph: onnx.GraphProto) -> int:
    """The nodes the profiler can time in ``graph``: its own and those of its subgraphs (an If's branches, a
    Loop's body), which it times one by one. silero-vad's optimized graph is 2 nodes, its profile 57 and this
    count 212 (both branches of its If): an over-count errs toward unprofiled runs, the top level alone away."""
    return sum(1 + sum(_node_count(g) for g in node_subgraphs(node)) for node in graph.node)


def _weighs(nodes: Sequence[int], walls: Mapping[int, Sequence[float]]) -> bool:
    """Whether the profiler's cost could reach ``MIN_GAIN`` of some model's runs (``nodes[i]``, its optimized
    graph's, x ``PROFILER_NODE_US`` against the runs' median, in ms): the test that has unprofiled runs replace
    the profiled ones, asked of the profiled durations, and of the runs' wall clock so far while the rounds go on."""
    return any(
        times and nodes[i] * PROFILER_NODE_US > MIN_GAIN * 1000.0 * statistics.median(times)
        for i, times in walls.items()
    )


def _read(
    session: Any, graph: onnx.GraphProto | str, batch_sizes: Sequence[int], counts: Sequence[int]
) -> dict[int, NodeProfile] | str:
    """The profile ``session`` wrote, parsed against its optimized ``graph`` (``_parse``); its profiling ends here."""
    try:
        events = json.loads(Path(session.end_profiling()).read_text())
    except (OSError, ValueError) as error:  # no profile file was written
        return f"no profile: {str(error)[:300]}"
    return graph if isinstance(graph, str) else _parse(events, graph, batch_sizes, counts)


def _parse(
    events: list[dict[str, Any]], graph: onnx.GraphProto, batch_sizes: Sequence[int], counts: Sequence[int]
) -> dict[int, NodeProfile] | str:
    """Split the profiler's events into its ``model_run``s (a node event lies inside its run's span), drop the
    first batch size's untimed run, and take the lower medians over each batch size's ``counts`` timed runs."""
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
                statistics.median_low(per_run[run].get(name, 0.0) for run in timed),
            )
            for name in names
        )
        durations = tuple(float(spans[run][1] - spans[run][0]) for run in timed)
        result[batch] = NodeProfile(nodes, durations, sum(durations))
    return result
