"""Histogram kernels for the observers: CPU nanoseconds per observed value, on real activations.

Not a test. Feeds the activations the default recipe observes (one calibration batch of a model) to
each candidate way of building the 2048-bin histogram of |x| that ``quantcore.observers.histogram`` keeps, and
prints the process CPU time per value (median of ``--repeats``), summed over every tensor:

- ``minmax``: numpy's two reductions ``x.min()``, ``x.max()``, about the cost of reading the values;
- ``percentile``: ``PercentileObserver.observe`` as calibration runs it on its first batch (the
  extremes, the floor chosen from a sample, then the values above the floor binned: two scans);
- ``percentile-later``: the same observer fed the same batch again, its range and floor in force:
  what every later batch costs (one scan, ``quantcore.observers._binning``);
- ``resolve_all``: the same observer with every bin resolved (what ``kl``/``mse``/``floating`` cost);
- ``torch-histc``: ``torch.histc(|x|, 2048, 0, top)``, one intra-op thread;
- ``torch-bincount-1t`` / ``-2t``: ``torch.aminmax`` then ``torch.bincount`` of the int32 bin indices,
  the same arithmetic as numpy (bit-identical counts), with one and with two intra-op threads
  (OpenMP threads spin after each parallel region: that CPU time counts).

Then the MSE threshold search each tensor's percentile histogram gets in the clip search
(``quantcore.observers.clipping.mse_amax``), run with ``SEARCH_THREADS`` (one) and with two torch threads: process
CPU ms and wall ms over every tensor: a first pass, then the median of ``--repeats`` more. (The kernels
above have already started torch's threads here; in a fresh process the first searches also pay for
that.)

    python -m bench.observer_kernels --case /tmp/qb3/cases/ocr-rec [--repeats 5]

``--case`` is a case directory ``bench.quality`` wrote (``model.onnx``, ``calibration.npz``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch

from quantcore import QuantizeConfig
from quantcore.annotate.annotation import annotate
from quantcore.graph.index import GraphIndex
from quantcore.observers import clipping
from quantcore.observers.histogram import PercentileObserver
from quantcore.prepare.preparation import prepare
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.session import open_session

BINS = 2048


def activations(case: Path, batch_size: int) -> list[np.ndarray]:
    """The observed activations of the first calibration batch (graph inputs left out)."""
    calibration = dict(np.load(case / "calibration.npz"))
    config = QuantizeConfig(batch_size=batch_size)
    prepared = prepare(case / "model.onnx")
    batch = next(iter(Batches(calibration, input_specs(prepared.model), batch_size, what="calibration")))
    inputs = set(GraphIndex(prepared.model.graph).graph_inputs)
    names = [n for n in annotate(prepared, config).activations if n not in inputs]
    prepared.model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    with open_session(prepared.model, spinning=False) as session:
        return [np.ascontiguousarray(a) for a in session.run(names, batch)]


def observer_kernel(resolve_all: bool) -> Callable[[np.ndarray], object]:
    def kernel(x: np.ndarray) -> object:
        observer = PercentileObserver(resolve_all=resolve_all)
        observer.observe(x)
        return observer.counts

    return kernel


def later_batch_kernel() -> Callable[[np.ndarray], object]:
    observers: dict[int, PercentileObserver] = {}  # one per tensor; the untimed warm-up call sets its floor

    def kernel(x: np.ndarray) -> object:
        observer = observers.setdefault(id(x), PercentileObserver())
        observer.observe(x)
        return observer.counts

    return kernel


def torch_bincount(x: np.ndarray) -> object:
    t = torch.from_numpy(x.ravel())
    lo, hi = torch.aminmax(t)
    top = max(-float(lo), float(hi)) or 1.0
    indices = torch.mul(t, BINS / top).abs_().to(torch.int32)
    return torch.bincount(indices, minlength=BINS + 1)


def torch_histc(x: np.ndarray) -> object:
    t = torch.from_numpy(x.ravel()).abs()
    return torch.histc(t, BINS, 0.0, float(t.max()) or 1.0)


# name -> (torch intra-op threads while it runs, kernel)
KERNELS: dict[str, tuple[int, Callable[[np.ndarray], object]]] = {
    "minmax": (1, lambda x: (x.min(), x.max())),
    "percentile": (1, observer_kernel(resolve_all=False)),
    "percentile-later": (1, later_batch_kernel()),
    "resolve_all": (1, observer_kernel(resolve_all=True)),
    "torch-histc": (1, torch_histc),
    "torch-bincount-1t": (1, torch_bincount),
    "torch-bincount-2t": (2, torch_bincount),
}


def cpu_ns_per_value(kernel: Callable[[np.ndarray], object], tensors: list[np.ndarray], repeats: int) -> float:
    """Median process CPU time of one pass of ``kernel`` over ``tensors``, per value."""
    values = sum(t.size for t in tensors)
    for t in tensors:  # warm-up: first-touch page faults are not the kernel's
        kernel(t)
    times = []
    for _ in range(repeats):
        started = time.process_time()
        for t in tensors:
            kernel(t)
        times.append(time.process_time() - started)
    return statistics.median(times) / values * 1e9


def mse_search_ms(tensors: list[np.ndarray], threads: int, repeats: int) -> tuple[float, float, float, float]:
    """(CPU, wall) ms of ``mse_amax`` over every tensor's percentile histogram with ``threads`` torch
    threads: the first pass, then the median of ``repeats`` more."""
    observers = [PercentileObserver() for _ in tensors]
    for observer, t in zip(observers, tensors, strict=True):
        observer.observe(t)
    searched = clipping.SEARCH_THREADS
    clipping.SEARCH_THREADS = threads
    try:
        passes = []
        for _ in range(repeats + 1):
            cpu, wall = time.process_time(), time.perf_counter()
            for observer in observers:
                clipping.mse_amax(observer)
            passes.append(((time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3))
    finally:
        clipping.SEARCH_THREADS = searched
    later = passes[1:]
    return (*passes[0], statistics.median(p[0] for p in later), statistics.median(p[1] for p in later))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, help="a bench.quality case directory")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    tensors = activations(Path(args.case), args.batch_size)
    total = sum(t.size for t in tensors)
    print(f"# {args.case}: {len(tensors)} tensors, {total / 1e6:.1f} M values", file=sys.stderr)
    print("| kernel | CPU ns / value | CPU s per batch |\n| --- | ---: | ---: |")
    for name, (threads, kernel) in KERNELS.items():
        torch.set_num_threads(threads)
        ns = cpu_ns_per_value(kernel, tensors, args.repeats)
        print(f"| {name} | {ns:.2f} | {ns * total / 1e9:.3f} |")
    print("\n| MSE threshold search, torch threads | first pass CPU ms | wall ms | later passes CPU ms | wall ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for threads in (clipping.SEARCH_THREADS, 2):
        torch.set_num_threads(2)  # what a process starts with on this machine; mse_amax sets its own
        timings = mse_search_ms(tensors, threads, args.repeats)
        print(f"| {threads} | " + " | ".join(f"{t:.1f}" for t in timings) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
