"""Stage 3, calibrate: derive every annotated tensor's scale and offset.

Weights (``annotation.parameters``) are read directly from their initializers: per-channel
amax[c] = max |W[c, ...]| over all but the channel axis, scale[c] = amax[c] / 127.

Activations: ONNX Runtime runs the prepared graph (all graph optimizations on: the exposed tensors stay
intact, fusions that would hide one are skipped) with the observed tensors added as extra graph
outputs, one batch at a time; each batch's values stream into the tensor's observer (``minmax``,
``percentile``, ...), so memory holds one batch of activations, never the dataset. ONNX Runtime writes
them into the same arrays batch after batch (``ActivationFetcher``), and its intra-op threads sleep
rather than spin between runs, leaving the cores to the observers.
The observers of one batch run on a thread pool (one thread per core; tensors sharing a scale feed
their one observer from one thread, in annotation order, so the result does not depend on scheduling;
a batch under ``PARALLEL_OBSERVE_BYTES`` is observed on the calling thread).
Cost per batch and tensor: once its range is settled, a histogram observer reads the tensor once
(``quantcore.observers.histogram``: one C scan that takes the extremes and counts the values in the tail the
percentile lies in), so calibration costs one inference plus about one read of the activations.
A percentile observer whose percentile the later batches pushed below the bins it resolved
(``Observer.complete`` false, data far lighter-tailed than the first batch) is replaced by a fully
resolved one, fed by a second pass over the batches that exposes only the tensors it observes.
Tensors sharing a scale through ``dominator`` links feed a single observer, that of the root of the
chain; the root becomes ACTIVATED and the others PASSIVE with the root's scale.
``calibrate_clips`` returns the calibration at several percentiles from the same pass (the
percentile histograms resolve their tails down to 64 times the configured percentile's share of
values: 99.9 and above for 99.99), and at each tensor's MSE threshold estimated on the same histogram
(``config.clip`` = ``mse``, ``quantcore.observers.clipping.mse_amax``), for ``quantcore.calibrate.clip_search``
to choose among.
``quantcore.numerics.scaling.scale_offset`` turns each observer's range into scale/offset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import onnxruntime as ort

from quantcore.annotate.annotation import Annotation
from quantcore.config import QuantizeConfig
from quantcore.errors import InvalidDataError
from quantcore.graph.index import GraphIndex
from quantcore.numerics.scaling import scale_offset
from quantcore.numerics.tqc import QuantState, TensorQuantConfig
from quantcore.observers import registry as observers
from quantcore.observers.clipping import mse_amax
from quantcore.observers.histogram import PercentileObserver
from quantcore.observers.registry import Observer, ObserverSettings
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import CancelCheck, Monitor, ProgressCallback
from quantcore.runtime.batching import EXPOSED_BYTES_PER_BATCH, Batches, input_specs
from quantcore.runtime.session import open_session

STAGE = "calibrate"
Clip = float | str  # where a percentile-observed tensor is clipped: a percentile of |x|, or "mse"


def make_observer(tqc: TensorQuantConfig, config: QuantizeConfig, *, resolve_all: bool = False) -> Observer:
    """The observer named by ``tqc.observer``, aimed at ``tqc``'s grid (kl, mse, floating search
    their range for it); the percentile comes from the run's config. ``resolve_all``: see
    ``quantcore.observers.registry`` (``complete``)."""
    return observers.make_observer(tqc, ObserverSettings(percentile=config.percentile, resolve_all=resolve_all))


def dominator_root(name: str, configs: Mapping[str, TensorQuantConfig]) -> str:
    """Follow ``dominator`` links from ``name`` to the tensor that owns the shared scale."""
    seen = [name]
    while configs[seen[-1]].dominator is not None:
        nxt = configs[seen[-1]].dominator
        if nxt not in configs:
            raise ValueError(f"tensor {seen[-1]!r} names dominator {nxt!r}, which is not annotated")
        if nxt in seen:
            raise ValueError(f"dominator cycle: {' -> '.join([*seen, nxt])}")
        seen.append(nxt)
    return seen[-1]


def calibrate_weights(
    prepared: PreparedModel,
    annotation: Annotation,
    config: QuantizeConfig,
) -> dict[str, TensorQuantConfig]:
    """Calibrated configs of every annotated parameter, straight from the initializer values."""
    index = GraphIndex(prepared.model.graph)
    calibrated = {}
    for name in sorted(annotation.parameters):
        tqc = annotation.configs[name]
        observer = make_observer(tqc, config)
        observer.observe(index.array(name))
        if not observer.complete:
            observer = make_observer(tqc, config, resolve_all=True)
            observer.observe(index.array(name))
        if observer.nonfinite:
            raise InvalidDataError(f"weight {name!r} contains {observer.nonfinite} NaN/infinite values")
        scale, offset = scale_offset(tqc, *observer.bounds())
        calibrated[name] = tqc.with_scale(scale, offset, state=QuantState.ACTIVATED)
    return calibrated


# Below this many bytes of activations in a batch, handing the observers to threads costs more than
# running them in parallel saves (thread wake-ups of some 10 µs each): such a batch is observed on the
# calling thread.
PARALLEL_OBSERVE_BYTES = 1 << 20


def observe_threads(groups: int) -> int:
    """Threads folding one batch into the observers: one per core (as many as ONNX Runtime's intra-op
    pool), at most one per observer. NumPy releases the GIL in the reductions, the binning arithmetic
    and the casts, so observers of different tensors overlap; each observer is fed by one thread only."""
    return max(1, min(groups, os.cpu_count() or 1))


class ActivationFetcher:
    """Runs the calibration session on one batch and returns the observed tensors, in ``names`` order.

    ``session.run`` allocates a fresh array for every fetched tensor and copies ONNX Runtime's result
    into it, batch after batch: with a hundred exposed activations that copy (and the page faults of
    the new memory) costs as much as the inference itself. So the arrays of one batch are bound
    (IOBinding) as the output buffers of the next batch with the same input shapes, and ONNX Runtime
    writes the tensors straight into them. The returned arrays are therefore overwritten by the next
    call: the caller must be done with them. Memory stays one batch of activations.
    A bound buffer whose shape no longer fits (an output whose shape depends on the data) makes ONNX
    Runtime refuse the run before any result is used; that batch is then run again unbound.
    """

    def __init__(self, session: ort.InferenceSession, names: list[str]) -> None:
        self.session, self.names = session, names
        self.binding = session.io_binding()
        self.buffers: list[np.ndarray] = []
        self.input_shapes: dict[str, tuple[int, ...]] | None = None
        self.quiet = ort.RunOptions()
        self.quiet.log_severity_level = 4  # a refused buffer is expected: no error line on stderr
        # ONNX Runtime's default graph id, named: its Python wrapper (1.32) looks the key up in every run's
        # options, and a missing key costs a raised and caught error, 24 µs a run: a third of the digits
        # CNN's calibration in batches of one, a fifth of wakeword-jarvis's
        self.quiet.add_run_config_entry("gpu_graph_id", "0")

    def __call__(self, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        shapes = {name: np.shape(value) for name, value in batch.items()}
        if self.buffers and shapes == self.input_shapes:
            for name, value in batch.items():
                self.binding.bind_cpu_input(name, np.ascontiguousarray(value))
            try:
                self.session.run_with_iobinding(self.binding, self.quiet)
                return self.buffers
            except RuntimeError:  # ONNX Runtime's error for an output shape that differs from its buffer
                pass
        self.buffers = [np.ascontiguousarray(a) for a in self.session.run(self.names, dict(batch))]
        self.input_shapes = shapes
        if any(a.size == 0 for a in self.buffers):  # an empty array has no memory to bind: next batch unbound
            self.input_shapes = None
            return self.buffers
        for name, array in zip(self.names, self.buffers, strict=True):
            self.binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        return self.buffers


def _exposed_bytes_per_sample(fetch: ActivationFetcher, batches: Batches) -> int:
    """The bytes of one sample's observed tensors, measured on an extra run of ``batches.probe``."""
    exposed, samples = batches.probe(lambda batch: sum(a.nbytes for a in fetch(batch)))
    return exposed // samples


def _observe(
    prepared: PreparedModel,
    batches: Batches,
    groups: Mapping[str, list[str]],
    observers: Mapping[str, Observer],
    config: QuantizeConfig,
    monitor: Monitor,
    *,
    report: bool,
    resizable: bool,
) -> Batches:
    """One pass over ``batches``: every tensor of ``groups`` (root -> the tensors its observer takes,
    in annotation order) exposed and folded into ``observers[root]``. Checks for cancellation before
    each batch; ``report``: progress after each. ``resizable``: batches whose exposed tensors would
    exceed ``EXPOSED_BYTES_PER_BATCH`` (``_exposed_bytes_per_sample``) are split.
    Returns the batches observed."""
    graph_inputs = set(GraphIndex(prepared.model.graph).graph_inputs)
    names = [name for members in groups.values() for name in members]
    fetched = [name for name in names if name not in graph_inputs]
    with open_session(prepared.model, device=config.device, spinning=False, outputs=fetched) as session:
        fetch = ActivationFetcher(session, fetched)
        if resizable and fetched and not batches.fixed and batches.batch_size > 1:
            batches = batches.within(_exposed_bytes_per_sample(fetch, batches), EXPOSED_BYTES_PER_BATCH)
        total = len(batches)
        threads = observe_threads(len(groups))  # the pool starts them at the first batch it is given
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="observe") as pool:
            for i, batch in enumerate(batches):
                monitor.check(STAGE)
                values = dict(zip(fetched, fetch(batch), strict=True)) if fetched else {}
                values.update((name, batch[name]) for name in names if name in graph_inputs)

                def observe_group(root: str, values: dict[str, np.ndarray] = values) -> None:
                    for name in groups[root]:
                        observers[root].observe(values[name])

                if threads > 1 and sum(v.nbytes for v in values.values()) >= PARALLEL_OBSERVE_BYTES:
                    list(pool.map(observe_group, groups))  # re-raises the first error
                else:
                    for root in groups:
                        observe_group(root)
                if report:
                    monitor.report(STAGE, (i + 1) / total, f"batch {i + 1}/{total}")
    return batches


def configured_clip(config: QuantizeConfig) -> Clip:
    """The clip ``config`` names for the tensors observed by ``percentile``: its percentile, or ``"mse"``."""
    return "mse" if config.clip == "mse" else config.percentile


def calibrate(
    prepared: PreparedModel,
    annotation: Annotation,
    calibration: Mapping[str, np.ndarray] | Batches,
    config: QuantizeConfig,
    *,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
) -> Annotation:
    """Return ``annotation`` with every config calibrated (states ACTIVATED or PASSIVE).

    ``calibration``: ``{input name: array}`` (samples along each input's batch axis, see
    ``quantcore.runtime.batching``) or prepared ``Batches``.
    Raises ``InvalidDataError`` for data that doesn't fit the model or drives a tensor non-finite,
    ``Canceled`` when ``should_cancel()`` turns True between batches.
    """
    calibrated = calibrate_clips(
        prepared, annotation, calibration, config, (), progress=progress, should_cancel=should_cancel
    )
    return calibrated[configured_clip(config)]


def _threshold(observer: PercentileObserver, clip: Clip) -> float:
    return mse_amax(observer) if clip == "mse" else observer.amax(clip)


def calibrate_clips(
    prepared: PreparedModel,
    annotation: Annotation,
    calibration: Mapping[str, np.ndarray] | Batches,
    config: QuantizeConfig,
    clips: Sequence[Clip],
    *,
    progress: ProgressCallback | None = None,
    should_cancel: CancelCheck | None = None,
) -> dict[Clip, Annotation]:
    """``calibrate``'s result for ``configured_clip(config)`` and for each of ``clips`` (percentiles, or
    ``"mse"``), from one pass over the data: the tensors observed by ``percentile`` take their range from
    the same histograms at that percentile or at their estimated MSE threshold, every other tensor the
    same range in all. A percentile below what the histograms resolved (``PercentileObserver.resolves``)
    is left out, and every clip but the configured one when no tensor is observed by ``percentile`` (they
    would all be the same)."""
    monitor = Monitor(progress, should_cancel)
    batches = (
        calibration
        if isinstance(calibration, Batches)
        else Batches(calibration, input_specs(prepared.model), config.batch_size, what="calibration")
    )
    weights = calibrate_weights(prepared, annotation, config)
    # a dynamic activation's range is its own at run time: nothing to observe
    dynamic = {
        n: annotation.configs[n].with_state(QuantState.ACTIVATED)
        for n in annotation.activations
        if annotation.configs[n].dynamic
    }
    activations = [name for name in annotation.activations if name not in dynamic]
    roots = {name: dominator_root(name, annotation.configs) for name in activations}
    groups: dict[str, list[str]] = {}  # root -> the tensors its observer takes, in annotation order
    for name in activations:
        groups.setdefault(roots[name], []).append(name)
    observers = {root: make_observer(annotation.configs[root], config) for root in groups}
    # an exponential moving average depends on how the samples are batched: its batches stay as given
    resizable = all(annotation.configs[root].observer != "ema_minmax" for root in groups)
    observed = batches
    if groups:
        observed = _observe(prepared, batches, groups, observers, config, monitor, report=True, resizable=resizable)
    incomplete = {root: groups[root] for root, observer in observers.items() if not observer.complete}
    if incomplete:
        observers.update(
            (root, make_observer(annotation.configs[root], config, resolve_all=True)) for root in incomplete
        )
        _observe(prepared, observed, incomplete, observers, config, monitor, report=False, resizable=False)
    for root, observer in observers.items():
        if observer.nonfinite:
            raise InvalidDataError(
                f"tensor {root!r} took {observer.nonfinite} NaN/infinite values on the calibration data"
            )

    notes = annotation.notes
    if observed.batch_size != batches.batch_size:
        notes += (
            f"calibration ran in batches of {observed.batch_size}, not {batches.batch_size}: a batch's observed "
            f"tensors are kept under {EXPOSED_BYTES_PER_BATCH >> 20} MB",
        )
    percentile_observers = [o for o in observers.values() if isinstance(o, PercentileObserver)]
    configured = configured_clip(config)
    results = {}
    for clip in dict.fromkeys((configured, *(clips if percentile_observers else ()))):
        if clip != "mse" and clip != configured and not all(o.resolves(clip) for o in percentile_observers):
            continue
        configs = {**annotation.configs, **weights, **dynamic}
        for root, observer in observers.items():
            if isinstance(observer, PercentileObserver):
                bounds = observer.bounds_for(_threshold(observer, clip))
            else:
                bounds = observer.bounds()
            scale, offset = scale_offset(annotation.configs[root], *bounds)
            configs[root] = annotation.configs[root].with_scale(scale, offset, state=QuantState.ACTIVATED)
        for name, root in roots.items():
            if name != root:
                configs[name] = annotation.configs[name].with_scale(
                    configs[root].scale, configs[root].offset, state=QuantState.PASSIVE
                )
        results[clip] = replace(annotation.with_configs(configs), notes=notes)
    return results
