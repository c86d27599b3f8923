"""Batches of named input arrays, checked against the model's inputs.

Calibration and evaluation data are ``{input name: array}`` holding the samples along each input's
*batch axis*. ``input_specs`` derives that axis from the model's declared shapes (``batch_axis``): the
batch symbol is the symbolic dimension found at axis 0 of the most inputs (ties: the earliest input),
and each input takes its batch axis where that symbol sits in its shape — a recurrent state declared
``(2, batch, 128)``, or ``(2, ?, 128)`` with the dimension left unnamed, is batched along axis 1. A
scalar (a sample rate ``sr``), or a fully fixed input of a model whose other inputs have a dynamic
batch, has no batch axis: its array is the value itself, fed unchanged with every batch. A model whose
inputs are all fixed is batched along axis 0 (its fixed batch size).

A ``Batches`` checks names, ranks, fixed dimensions, sample counts and dtypes up front
(``InvalidDataError`` naming the input), then yields one batch at a time as views cast to the model's
dtype — the full arrays are never copied. Batch size: the model's own batch dimension when every batched
input fixes it to the same integer (samples past the last full batch are then dropped, since the model
can't run a short batch), otherwise the configured ``batch_size`` (the last batch may be short).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx

from quantcore.errors import InvalidDataError, UnsupportedModelError
from quantcore.graph.index import value_type
from quantcore.runtime.session import RUNTIME_ERRORS

T = TypeVar("T")


def describe(arrays: Mapping[str, np.ndarray]) -> str:
    """Named arrays as an error message shows them: "'x' float32 (8, 16), 'mask' bool (8, 16)"."""
    return ", ".join(f"{name!r} {np.asarray(array).dtype} {np.shape(array)}" for name, array in arrays.items())


@dataclass(frozen=True)
class InputSpec:
    """A model input: numpy dtype and shape (int fixed, str symbolic, None unknown; None if rank unknown),
    and the axis its samples run along (None: a constant input, the same value for every batch)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None
    batch_axis: int | None = 0

    @property
    def fixed_batch(self) -> int | None:
        if self.shape and self.batch_axis is not None:
            size = self.shape[self.batch_axis]
            if isinstance(size, int) and size > 0:
                return size
        return None


def batch_symbol(shapes: list[tuple[int | str | None, ...] | None]) -> str | None:
    """The symbolic dimension at axis 0 of the most inputs (ties: the earliest), None if no input has one."""
    leading = Counter(shape[0] for shape in shapes if shape and isinstance(shape[0], str))
    return max(leading, key=lambda symbol: leading[symbol]) if leading else None  # max keeps the first of ties


def _fixed(dim: int | str | None) -> bool:
    return isinstance(dim, int) and dim > 0


def batch_axis(shape: tuple[int | str | None, ...] | None, symbol: str | None, dynamic_batch: bool) -> int | None:
    """The batch axis of an input of declared ``shape`` (see module), given the model's batch ``symbol``
    and whether any input's axis 0 is dynamic (symbolic or unknown):

    - where ``symbol`` sits in the shape; else axis 0 if it is dynamic;
    - else the shape's only unknown (unnamed) dimension: ``(2, ?, 128)`` is batched along axis 1;
    - None (a constant input) for a scalar, or for a fully fixed shape while other inputs have a
      dynamic batch;
    - otherwise (unknown rank, a model whose every input is fixed) axis 0.
    """
    if shape is None:
        return 0
    if not shape:
        return None
    if symbol is not None and symbol in shape:
        return shape.index(symbol)
    if not _fixed(shape[0]):
        return 0
    unknown = [axis for axis, dim in enumerate(shape) if dim is None]
    if len(unknown) == 1:
        return unknown[0]
    if dynamic_batch and all(_fixed(dim) for dim in shape):
        return None
    return 0


def batch_axes(shapes: Sequence[Sequence[int | str | None] | None]) -> list[int | None]:
    """The batch axis of each of a model's inputs, given all their declared shapes (see module). The one
    rule for every consumer: ``input_specs`` here, and ``inspect_model``, which records the axes on the
    upload so the service checks datasets with them without loading the engine."""
    shapes = [None if shape is None else tuple(shape) for shape in shapes]
    symbol = batch_symbol(shapes)
    dynamic_batch = any(shape and not _fixed(shape[0]) for shape in shapes)
    return [batch_axis(shape, symbol, dynamic_batch) for shape in shapes]


def output_batch_axes(model: onnx.ModelProto) -> dict[str, int]:
    """The axis each graph output's samples run along, for per-sample metrics: where the inputs' batch
    symbol (see module) sits in the output's declared shape, else axis 0. A recurrent model's
    ``state_out (2, batch, 128)`` has its samples on axis 1."""
    initializers = {t.name for t in model.graph.initializer}
    symbol = batch_symbol([value_type(i)[1] for i in model.graph.input if i.name not in initializers])
    axes = {}
    for output in model.graph.output:
        shape = value_type(output)[1]
        axes[output.name] = shape.index(symbol) if symbol is not None and shape and symbol in shape else 0
    return axes


def input_specs(model: onnx.ModelProto | str | Path) -> list[InputSpec]:
    """The real inputs of ``model`` (or of the model file at that path, read without its external
    data), initializers listed as graph inputs excluded, in graph order, each with its batch axis (see
    module)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value_info in model.graph.input:
        if value_info.name in initializers:
            continue
        dtype, shape = value_type(value_info)
        if value_info.type.WhichOneof("value") != "tensor_type":
            raise UnsupportedModelError(f"input {value_info.name!r} is a {dtype}, only tensor inputs are supported")
        specs.append(InputSpec(value_info.name, np.dtype(dtype), None if shape is None else tuple(shape)))
    axes = batch_axes([spec.shape for spec in specs])
    return [replace(spec, batch_axis=axis) for spec, axis in zip(specs, axes, strict=True)]


# The tensors a run exposes as graph outputs on top of the model's own (calibration's observed tensors,
# the cut the analysis' layer-wise reference runs fetch) stay alive until the batch is done; above this many
# bytes a batch is split (``Batches.within``). A 320x320 YOLOv8n exposed 43 to 51 MB a sample for calibration
# (batches of 5) and over 128 MB for the analysis (batches of 1): its peak memory fell from 2387 to 1044 MB.
# (The analysis' graph-wise runs have fetched scalars only since ``quantcore.analysis.graphwise``.)
# (Since its SiLUs are left to TensorRT's fusion, 24 MB a sample for calibration: batches of 8.)
EXPOSED_BYTES_PER_BATCH = 256 << 20


def take_window(array: np.ndarray, axis: int, start: int, size: int) -> np.ndarray:
    """Samples ``start`` .. ``start + size - 1`` along ``axis`` (fewer at the end): a view, not a copy."""
    return array[(slice(None),) * axis + (slice(start, start + size),)]


class Batches:
    """Checked, re-iterable batches over ``arrays``; ``what`` ("calibration", ...) prefixes messages."""

    def __init__(self, arrays: Mapping[str, np.ndarray], specs: list[InputSpec], batch_size: int, *, what: str) -> None:
        self.what = what
        self.specs = specs
        self.arrays, counts = self._check(arrays, specs)
        self.total_samples = next(iter(counts.values()))
        fixed = {s.fixed_batch for s in specs if s.fixed_batch is not None}
        if len(fixed) > 1:
            raise UnsupportedModelError(f"inputs fix different batch sizes {sorted(fixed)}; cannot batch them")
        self.fixed = bool(fixed)
        self.batch_size = fixed.pop() if fixed else batch_size
        if self.fixed and self.total_samples < self.batch_size:
            raise InvalidDataError(
                f"{what} data has {self.total_samples} samples but the model's fixed batch size is {self.batch_size}"
            )
        # samples actually used: with a fixed batch dimension a trailing partial batch is dropped
        self.num_samples = self.total_samples // self.batch_size * self.batch_size if self.fixed else self.total_samples
        # constant inputs: converted once, the same array in every batch
        # (np.array, not np.ascontiguousarray, which turns a scalar into shape (1,))
        self.constants = {s.name: np.array(self.arrays[s.name], dtype=s.dtype) for s in specs if s.batch_axis is None}

    def _check(
        self, arrays: Mapping[str, np.ndarray], specs: list[InputSpec]
    ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """(arrays as numpy, samples per batched input)."""
        what = self.what
        if not isinstance(arrays, Mapping):
            raise InvalidDataError(f"{what} data must be a mapping of input name to array")
        names = [s.name for s in specs]
        for spec in specs:
            if spec.name not in arrays:
                raise InvalidDataError(f"{what} data has no array for model input {spec.name!r} (inputs: {names})")
        for name in arrays:
            if name not in names:
                raise InvalidDataError(
                    f"{what} data has an array {name!r} but the model has no such input (inputs: {names})"
                )
        checked: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        for spec in specs:
            array = np.asarray(arrays[spec.name])
            axis = spec.batch_axis
            if axis is not None and array.ndim <= axis:
                where = "the first axis" if axis == 0 else f"axis {axis} (the model's batch axis)"
                raise InvalidDataError(
                    f"{what} array {spec.name!r} has shape {array.shape}; {where} must be samples"
                    + (f" (model shape {list(spec.shape)})" if spec.shape is not None else "")
                )
            if spec.shape is not None:
                if array.ndim != len(spec.shape):
                    raise InvalidDataError(
                        f"{what} array {spec.name!r} has shape {array.shape}, the model "
                        f"expects rank {len(spec.shape)} {list(spec.shape)}"
                    )
                for dim, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
                    if dim != axis and isinstance(want, int) and want > 0 and got != want:
                        raise InvalidDataError(
                            f"{what} array {spec.name!r} has shape {array.shape}; dimension "
                            f"{dim} must be {want} (model shape {list(spec.shape)})"
                        )
            if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
                raise InvalidDataError(
                    f"{what} array {spec.name!r} has dtype {array.dtype}, the model input is {spec.dtype}"
                )
            if axis is not None:
                if array.shape[axis] == 0:
                    raise InvalidDataError(f"{what} array {spec.name!r} has no samples")
                counts[spec.name] = array.shape[axis]
            elif array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                raise InvalidDataError(f"{what} array {spec.name!r} has NaN or infinite values")
            checked[spec.name] = array
        if not counts:
            raise InvalidDataError(f"{what} data: no model input has a batch axis to take samples along ({names})")
        if len(set(counts.values())) > 1:
            raise InvalidDataError(f"{what} arrays disagree on the number of samples: {counts}")
        return checked, counts

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def first(self, samples: int) -> Batches:
        """The first ``samples`` samples (a fixed batch: whole batches, one at least) in these batches."""
        other = copy.copy(self)
        count = min(self.num_samples, samples)
        other.num_samples = max(count // self.batch_size, 1) * self.batch_size if self.fixed else count
        return other

    def held_out(self, fraction: float, at_most: int, at_least: int) -> tuple[Batches, Batches] | None:
        """(the samples before, the last ``fraction`` of these samples, ``at_most`` of them; a fixed batch: whole
        batches), each as batches of their own: a part to fit on and a part the fit is scored on without having
        seen it. None when either part would hold under ``at_least`` samples or under one batch."""
        step = self.batch_size if self.fixed else 1
        count = math.ceil(min(at_most, self.num_samples * fraction) / step) * step
        cut = self.num_samples - count
        if count < at_least or cut < max(at_least, step):
            return None

        def part(start: int, size: int) -> Batches:
            return Batches(self.window(start, size), self.specs, self.batch_size, what=self.what)

        return part(0, cut), part(cut, count)

    def window(self, start: int, count: int) -> dict[str, np.ndarray]:
        """Samples ``start`` .. ``start + count - 1`` of every batched input (views, fewer at the end), each
        constant input whole: the arrays of a part of these samples, for ``Batches`` of their own."""
        return {
            spec.name: self.arrays[spec.name]
            if spec.batch_axis is None
            else take_window(self.arrays[spec.name], spec.batch_axis, start, count)
            for spec in self.specs
        }

    def first_sample(self) -> dict[str, np.ndarray]:
        """The first sample alone, as a batch of one (constant inputs whole; a fixed batch: the first)."""
        return next(iter(self.resized(1)))

    def probe(self, run: Callable[[dict[str, np.ndarray]], T]) -> tuple[T, int]:
        """``run`` on the first sample alone (what a per-sample cost is measured on), and the samples it ran
        on; for a model that does not run on one sample (its batch axis is time, convolved over: madmom's
        onset CNN), ``run`` on the first batch instead, whose samples are then the unit."""
        try:
            return run(self.first_sample()), self.batch_size if self.fixed else 1
        except RUNTIME_ERRORS:
            return run(next(iter(self))), min(self.batch_size, self.num_samples)

    def resized(self, batch_size: int) -> Batches:
        """The same samples in batches of ``batch_size``, without copying or checking them again; a model's
        fixed batch does not change."""
        other = copy.copy(self)
        if not self.fixed:
            other.batch_size = batch_size
        return other

    def within(self, bytes_per_sample: int, budget: int) -> Batches:
        """These batches, smaller where a batch would hold more than ``budget`` bytes at ``bytes_per_sample``
        (one sample at least; a fixed batch stays as it is)."""
        size = max(1, budget // max(bytes_per_sample, 1))
        return self if size >= self.batch_size else self.resized(size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, self.num_samples, self.batch_size):
            stop = min(start + self.batch_size, self.num_samples)
            batch = {}
            for spec in self.specs:
                if spec.batch_axis is None:
                    batch[spec.name] = self.constants[spec.name]
                    continue
                part = np.ascontiguousarray(
                    take_window(self.arrays[spec.name], spec.batch_axis, start, stop - start), dtype=spec.dtype
                )
                if part.dtype.kind == "f" and not np.all(np.isfinite(part)):
                    raise InvalidDataError(
                        f"{self.what} array {spec.name!r} has NaN or infinite values in samples {start}..{stop - 1}"
                    )
                batch[spec.name] = part
            yield batch
