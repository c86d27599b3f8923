"""Batches of named input arrays, checked against the model's inputs.

Calibration and evaluation data are ``{input name: array}`` whose first axis is samples. A ``Batches``
checks names, ranks, fixed dimensions, sample counts and dtypes up front (``InvalidDataError`` naming
the input), then yields one batch at a time as views cast to the model's dtype — the full arrays are
never copied. Batch size: the model's own dimension 0 when every input fixes it to the same integer
(samples past the last full batch are then dropped, since the model can't run a short batch),
otherwise the configured ``batch_size`` (the last batch may be short).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from quantcore.errors import InvalidDataError, UnsupportedModelError
from quantcore.graph import value_type


@dataclass(frozen=True)
class InputSpec:
    """A model input: numpy dtype and shape (int fixed, str symbolic, None unknown; None if rank unknown)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None

    @property
    def fixed_batch(self) -> int | None:
        if self.shape and isinstance(self.shape[0], int) and self.shape[0] > 0:
            return self.shape[0]
        return None


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (initializers listed as graph inputs excluded), in graph order."""
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for value_info in model.graph.input:
        if value_info.name in initializers:
            continue
        dtype, shape = value_type(value_info)
        if value_info.type.WhichOneof("value") != "tensor_type":
            raise UnsupportedModelError(f"input {value_info.name!r} is a {dtype}, only tensor inputs are supported")
        specs.append(InputSpec(value_info.name, np.dtype(dtype), None if shape is None else tuple(shape)))
    return specs


class Batches:
    """Checked, re-iterable batches over ``arrays``; ``what`` ("calibration", ...) prefixes messages."""

    def __init__(self, arrays: Mapping[str, np.ndarray], specs: list[InputSpec], batch_size: int, *, what: str) -> None:
        self.what = what
        self.specs = specs
        self.arrays = self._check(arrays, specs)
        self.total_samples = len(next(iter(self.arrays.values())))
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

    def _check(self, arrays: Mapping[str, np.ndarray], specs: list[InputSpec]) -> dict[str, np.ndarray]:
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
            if array.ndim == 0:
                raise InvalidDataError(f"{what} array {spec.name!r} is a scalar; the first axis must be samples")
            if spec.shape is not None:
                if array.ndim != len(spec.shape):
                    raise InvalidDataError(
                        f"{what} array {spec.name!r} has shape {array.shape}, the model "
                        f"expects rank {len(spec.shape)} {list(spec.shape)}"
                    )
                for axis, (got, want) in enumerate(zip(array.shape[1:], spec.shape[1:], strict=True), start=1):
                    if isinstance(want, int) and want > 0 and got != want:
                        raise InvalidDataError(
                            f"{what} array {spec.name!r} has shape {array.shape}; dimension "
                            f"{axis} must be {want} (model shape {list(spec.shape)})"
                        )
            if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
                raise InvalidDataError(
                    f"{what} array {spec.name!r} has dtype {array.dtype}, the model input is {spec.dtype}"
                )
            if array.shape[0] == 0:
                raise InvalidDataError(f"{what} array {spec.name!r} has no samples")
            counts[spec.name] = array.shape[0]
            checked[spec.name] = array
        if len(set(counts.values())) > 1:
            raise InvalidDataError(f"{what} arrays disagree on the number of samples: {counts}")
        return checked

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, self.num_samples, self.batch_size):
            stop = min(start + self.batch_size, self.num_samples)
            batch = {}
            for spec in self.specs:
                part = np.ascontiguousarray(self.arrays[spec.name][start:stop], dtype=spec.dtype)
                if part.dtype.kind == "f" and not np.all(np.isfinite(part)):
                    raise InvalidDataError(
                        f"{self.what} array {spec.name!r} has NaN or infinite values in samples {start}..{stop - 1}"
                    )
                batch[spec.name] = part
            yield batch
