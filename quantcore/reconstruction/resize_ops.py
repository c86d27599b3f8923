"""ONNX Resize as a torch function (``torch_ops.OPS`` convention), modes ``nearest`` and ``linear``.

Each resized axis is done on its own, as the specification defines it: output position x maps to
x_original by ``coordinate_transformation_mode`` (half_pixel, half_pixel_symmetric, pytorch_half_pixel,
align_corners, asymmetric), then

- nearest: the input element at x_original rounded by ``nearest_mode`` (round_prefer_floor,
  round_prefer_ceil, floor, ceil), clamped to [0, n - 1];
- linear: (1 - w)·x[i] + w·x[i + 1] with i = floor(x_original), w = x_original - i, indices clamped
  to [0, n - 1] (the specification's edge padding); N-linear is this along every resized axis in turn.

The indices are computed on the host from the shapes and the values moved by ``index_select``, so a
gradient reaches exactly the elements the output reads. ``torch.nn.functional.interpolate`` is not
used: its ``nearest`` is asymmetric-floor only and its scale arguments round differently.

Not converted (``CHECKS``): mode cubic (an a-parameterised kernel with ``exclude_outside``),
tf_crop_and_resize (a region of interest and an extrapolation value), antialias with linear (a
widened filter when downscaling), and ``keep_aspect_ratio_policy`` other than stretch.
"""

from __future__ import annotations

import math
from typing import Any

import onnx
import torch


def _original(x: torch.Tensor, mode: str, n: int, m: int, scale: float) -> torch.Tensor:
    """x_original (float64) of output positions ``x`` on an axis of input length n, output length m,
    ``scale`` as given (or m / n from ``sizes``)."""
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return x * (n - 1) / (m - 1) if m > 1 else torch.zeros_like(x)
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if m > 1 else torch.zeros_like(x)
    if mode == "half_pixel_symmetric":
        adjustment = m / (scale * n)  # output_width_int / output_width
        return n / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5
    return (x + 0.5) / scale - 0.5  # half_pixel


def _nearest(x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "floor":
        return torch.floor(x)
    if mode == "ceil":
        return torch.ceil(x)
    half = x - torch.floor(x) == 0.5
    if mode == "round_prefer_ceil":
        return torch.where(half, torch.ceil(x), torch.round(x))
    return torch.where(half, torch.floor(x), torch.round(x))  # round_prefer_floor


def _axis_plan(inputs, attrs, rank: int, shape: list[int]) -> list[tuple[int, int, float]]:
    """(axis, output length, scale) for every axis the node resizes."""
    scales = inputs[2] if len(inputs) > 2 else (inputs[1] if len(inputs) == 2 else None)
    sizes = inputs[3] if len(inputs) > 3 else None
    axes = [a + rank if a < 0 else a for a in attrs.get("axes", range(rank))]
    plan = []
    if sizes is not None and sizes.numel() > 0:
        for axis, size in zip(axes, sizes.tolist(), strict=True):
            plan.append((axis, int(size), int(size) / shape[axis]))
    else:
        for axis, scale in zip(axes, scales.tolist(), strict=True):
            plan.append((axis, math.floor(shape[axis] * scale), float(scale)))
    return [(axis, m, scale) for axis, m, scale in plan if not (m == shape[axis] and scale == 1.0)]


def resize(inputs, attrs):
    x = inputs[0]
    mode = attrs.get("mode", "nearest")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    for axis, m, scale in _axis_plan(inputs, attrs, x.ndim, list(x.shape)):
        n = x.shape[axis]
        original = _original(torch.arange(m, dtype=torch.float64), transform, n, m, scale)
        if mode == "nearest":
            index = _nearest(original, attrs.get("nearest_mode", "round_prefer_floor")).clamp(0, n - 1)
            x = x.index_select(axis, index.to(torch.int64).to(x.device))
            continue
        low = torch.floor(original)
        weight = (original - low).to(x.dtype).to(x.device)
        low_index = low.clamp(0, n - 1).to(torch.int64).to(x.device)
        high_index = (low + 1).clamp(0, n - 1).to(torch.int64).to(x.device)
        shape = [1] * x.ndim
        shape[axis] = m  # the weights broadcast along every other axis
        weight = weight.reshape(shape)
        x = x.index_select(axis, low_index) * (1 - weight) + x.index_select(axis, high_index) * weight
    return [x]


def _check_resize(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    mode = attrs.get("mode", "nearest")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear"):
        return f"Resize mode {mode!r}: only nearest and linear are converted"
    if transform == "tf_crop_and_resize":
        return "Resize coordinate_transformation_mode 'tf_crop_and_resize': a region of interest is not converted"
    if transform not in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"):
        return f"Resize coordinate_transformation_mode {transform!r} is not an ONNX mode"
    if mode == "linear" and attrs.get("antialias", 0):
        return "Resize antialias 1 with mode linear: the widened downscaling filter is not converted"
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return f"Resize keep_aspect_ratio_policy {attrs['keep_aspect_ratio_policy']!r}: only stretch is converted"
    nearest = attrs.get("nearest_mode", "round_prefer_floor")
    if nearest not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        return f"Resize nearest_mode {nearest!r} is not an ONNX mode"
    return None


OPS = {"Resize": resize}
CHECKS = {"Resize": _check_resize}
