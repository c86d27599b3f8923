"""Optimization profiles: the (min, opt, max) shape of every dynamic input a TensorRT engine serves.

TensorRT needs one profile per range of shapes an engine must accept; a dimension that is symbolic in
the ONNX model (``"N"``, ``"seq"``, or unnamed) must get concrete bounds, fixed dimensions are copied.
TensorRT tunes kernels for ``opt`` and accepts any shape with min ≤ shape ≤ max per dimension.

Profiles come from the recipe (``OptimizationProfile`` objects, validated against the model here), or
are derived from the shapes the calibration data was fed at (``observed_shapes``): per dimension
min = the smallest seen, max = the largest seen, opt = the most frequent whole shape (ties: the larger).
Each input's batch axis is ``quantcore.runtime.batching``'s (axis 1 of a state declared ``(2, batch, 128)``; a
scalar input has no dimension to bound); ``batch_sizes`` widens a dynamic batch axis to also cover the
batch sizes the engine will be measured and deployed at. A dynamic non-batch dimension seen at one
size only (images of one resolution) gets min = opt = max: the engine then accepts that size only, and
serving others needs profiles in the recipe.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantcore.errors import InvalidDataError
from quantcore.runtime.batching import InputSpec, input_specs


def _dims(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a sequence of integers, got {value!r}")
    dims = []
    for dim in value:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"{name} must hold integers >= 1, got {value!r}")
        dims.append(int(dim))
    return tuple(dims)


@dataclass(frozen=True)
class ShapeRange:
    """min ≤ opt ≤ max, per dimension, all of one rank; every dimension ≥ 1."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        for field in ("min", "opt", "max"):
            object.__setattr__(self, field, _dims(field, getattr(self, field)))
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError(f"min/opt/max must have one rank, got {self.min}, {self.opt}, {self.max}")
        if not all(a <= b <= c for a, b, c in zip(self.min, self.opt, self.max, strict=True)):
            raise ValueError(f"need min <= opt <= max per dimension, got {self.min}, {self.opt}, {self.max}")

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class OptimizationProfile:
    """One TensorRT optimization profile: input name → ShapeRange (stored as sorted pairs, so frozen).
    Construct with ``OptimizationProfile.of({"input": ShapeRange(...)})``."""

    shapes: tuple[tuple[str, ShapeRange], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.shapes, tuple) or not self.shapes:
            raise ValueError("shapes must be a non-empty tuple of (input name, ShapeRange)")
        for item in self.shapes:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError(f"shapes entries must be (input name, ShapeRange), got {item!r}")
            if not isinstance(item[1], ShapeRange):
                raise ValueError(f"shapes[{item[0]!r}] must be a ShapeRange, got {item[1]!r}")
        names = [name for name, _ in self.shapes]
        if len(set(names)) != len(names):
            raise ValueError(f"an input appears twice in one profile: {names}")
        object.__setattr__(self, "shapes", tuple(sorted(self.shapes)))

    @classmethod
    def of(cls, shapes: Mapping[str, ShapeRange]) -> OptimizationProfile:
        return cls(tuple(shapes.items()))

    def __getitem__(self, name: str) -> ShapeRange:
        return dict(self.shapes)[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.shapes)

    def to_dict(self) -> dict[str, Any]:
        return {name: shape.to_dict() for name, shape in self.shapes}


def dynamic_inputs(model: onnx.ModelProto) -> dict[str, tuple[int | str | None, ...]]:
    """Inputs with at least one dimension that is not a fixed positive integer, with their shapes."""
    dynamic = {}
    for spec in input_specs(model):
        if spec.shape is None:
            raise InvalidDataError(f"input {spec.name!r} has no known rank; TensorRT needs its shape")
        if any(not (isinstance(d, int) and d > 0) for d in spec.shape):
            dynamic[spec.name] = spec.shape
    return dynamic


def observed_shapes(
    data: Mapping[str, np.ndarray], batch_size: int, specs: Sequence[InputSpec]
) -> dict[str, list[tuple[int, ...]]]:
    """The shapes the arrays of ``data`` are fed at in batches of ``batch_size`` along each input's batch
    axis (``specs``, ``quantcore.runtime.batching``): full batches, then the remainder (if any); a constant
    input at its own shape."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    axes = {spec.name: spec.batch_axis for spec in specs}
    shapes = {}
    for name, array in data.items():
        shape, axis = tuple(int(d) for d in np.shape(array)), axes[name]
        if axis is None:
            shapes[name] = [shape]
            continue
        samples = shape[axis]
        sizes = [batch_size] if samples >= batch_size else []
        if samples % batch_size:
            sizes.append(samples % batch_size)
        shapes[name] = [(*shape[:axis], size, *shape[axis + 1 :]) for size in sizes]
    return shapes


def derive_range(
    shapes: Sequence[Sequence[int]], *, batch_sizes: Sequence[int] = (), batch_axis: int = 0
) -> ShapeRange:
    """min/max per dimension over ``shapes``, opt the most frequent shape (ties: the larger volume);
    ``batch_axis`` widened to cover ``batch_sizes``."""
    seen = [tuple(int(d) for d in shape) for shape in shapes]
    if not seen or len({len(s) for s in seen}) != 1:
        raise InvalidDataError(f"cannot derive a shape range from {seen!r} (none, or ranks differ)")
    counts = Counter(seen)
    opt = max(counts, key=lambda s: (counts[s], int(np.prod(s)), s))
    low = [min(s[i] for s in seen) for i in range(len(opt))]
    high = [max(s[i] for s in seen) for i in range(len(opt))]
    if batch_sizes:
        low[batch_axis] = min(low[batch_axis], *batch_sizes)
        high[batch_axis] = max(high[batch_axis], *batch_sizes)
    return ShapeRange(tuple(low), opt, tuple(high))


def _check_fits(name: str, declared: tuple[int | str | None, ...], shape: ShapeRange) -> None:
    if len(declared) != len(shape.min):
        raise InvalidDataError(f"profile for input {name!r} has rank {len(shape.min)}, the model's is {len(declared)}")
    for axis, dim in enumerate(declared):
        if isinstance(dim, int) and dim > 0 and not shape.min[axis] == shape.max[axis] == dim:
            raise InvalidDataError(
                f"profile for input {name!r} axis {axis} is {shape.min[axis]}..{shape.max[axis]}, "
                f"the model fixes it to {dim}"
            )


def profiles_for(
    model: onnx.ModelProto,
    *,
    explicit: Sequence[OptimizationProfile] | None = None,
    calibration_shapes: Mapping[str, Sequence[Sequence[int]]] | None = None,
    batch_sizes: Sequence[int] = (),
) -> tuple[OptimizationProfile, ...]:
    """The profiles to build ``model`` with; () when every input is static (TensorRT needs none).

    explicit: the recipe's profiles, each checked to cover every dynamic input at its rank and fixed
    dimensions (``InvalidDataError`` naming the input otherwise). Else one profile derived from
    ``calibration_shapes`` (``{input: [shape fed, ...]}``, e.g. ``observed_shapes(data, batch, specs)``),
    each input's batch axis widened to ``batch_sizes`` where it is dynamic.
    """
    dynamic = dynamic_inputs(model)
    if not dynamic:
        return ()
    if explicit:
        for index, profile in enumerate(explicit):
            missing = sorted(set(dynamic) - set(profile.names))
            if missing:
                raise InvalidDataError(f"profile {index} gives no shapes for dynamic input(s) {missing}")
            for name, shape in profile.shapes:
                declared = dynamic.get(name)
                if declared is not None:
                    _check_fits(name, declared, shape)
        return tuple(explicit)
    calibration_shapes = calibration_shapes or {}
    missing = sorted(set(dynamic) - set(calibration_shapes))
    if missing:
        raise InvalidDataError(
            f"dynamic input(s) {missing} have neither a profile in the recipe nor calibration shapes to derive one"
        )
    axes = {spec.name: spec.batch_axis for spec in input_specs(model)}
    ranges = {}
    for name, declared in dynamic.items():
        axis = axes[name]
        batch_dynamic = axis is not None and not (isinstance(declared[axis], int) and declared[axis] > 0)
        shape = derive_range(
            calibration_shapes[name], batch_sizes=batch_sizes if batch_dynamic else (), batch_axis=axis or 0
        )
        _check_fits(name, declared, shape)
        ranges[name] = shape
    return (OptimizationProfile.of(ranges),)
