"""ONNX shape, index and type ops as torch functions: the integer side-computations of a graph (a
tensor's shape read, sliced and gathered into a Reshape's target, a mask cast to float) and the ops that
move values by index (Gather, Slice, Pad, Expand).

Same calling convention as ``torch_ops.OPS``; ``CHECKS[op_type](node, attrs)`` says why a node's
attributes or inputs are outside what its function reproduces (None: supported). Semantics follow the
ONNX operator specification, opset 13 and later (``starts``/``ends``/``axes``/``steps``, ``pads``,
``axes`` as inputs). Index arithmetic is done on Python integers; values move by ``index_select`` so that
gradients reach the data exactly as the ONNX op routes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

# ONNX TensorProto data type → torch dtype for Cast, ConstantOfShape and Range results. The unsigned
# 16/32/64-bit, string, complex and 8-bit float types are absent: torch computes little on them.
DTYPES: dict[int, torch.dtype] = {
    TensorProto.FLOAT: torch.float32,
    TensorProto.DOUBLE: torch.float64,
    TensorProto.FLOAT16: torch.float16,
    TensorProto.BFLOAT16: torch.bfloat16,
    TensorProto.INT8: torch.int8,
    TensorProto.UINT8: torch.uint8,
    TensorProto.INT16: torch.int16,
    TensorProto.INT32: torch.int32,
    TensorProto.INT64: torch.int64,
    TensorProto.BOOL: torch.bool,
}


def _ints(value: torch.Tensor | None) -> list[int] | None:
    return None if value is None else [int(v) for v in value.reshape(-1).tolist()]


def _positive_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def shape(inputs, attrs):
    """Shape with ``start``/``end`` (opset 15): Python slice semantics, negatives counted from the end and
    both clamped to [0, rank], as the specification states."""
    dims = list(inputs[0].shape)[attrs.get("start", 0) : attrs.get("end", None)]
    return [torch.tensor(dims, dtype=torch.int64, device=inputs[0].device)]


def gather(inputs, attrs):
    """Gather along ``axis`` (default 0): output shape data.shape[:axis] + indices.shape +
    data.shape[axis + 1:]; a negative index i reads i + data.shape[axis]."""
    data, indices = inputs[0], inputs[1].to(torch.int64)
    axis = _positive_axis(attrs.get("axis", 0), data.ndim)
    size = data.shape[axis]
    flat = torch.where(indices < 0, indices + size, indices).reshape(-1)
    taken = data.index_select(axis, flat)
    return [taken.reshape((*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :]))]


def _slice_range(start: int, end: int, step: int, size: int) -> range:
    """The indices Slice takes on one axis: start and end shifted by ``size`` when negative, then
    clamped to [0, size] (step > 0) or [0, size - 1] and [-1, size - 1] (step < 0)."""
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), size), min(max(end, 0), size), step)
    return range(min(max(start, 0), size - 1), min(max(end, -1), size - 1), step)


def slice_(inputs, attrs):
    """Slice (opset 10+): starts, ends, optional axes (negatives from the end) and steps (any non-zero,
    negative ones walking backwards)."""
    x = inputs[0]
    starts, ends = _ints(inputs[1]), _ints(inputs[2])
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
    steps = _ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = _positive_axis(axis, x.ndim)
        taken = _slice_range(start, end, step, x.shape[axis])
        if step > 0:
            x = x[(slice(None),) * axis + (slice(taken.start, taken.stop, step),)]
        else:
            x = x.index_select(axis, torch.tensor(list(taken), dtype=torch.int64, device=x.device))
    return [x]


def expand(inputs, attrs):
    """Expand: bidirectional broadcasting of the input and ``shape`` (a 1 in ``shape`` keeps the input's
    dimension, as numpy's ``x * ones(shape)``)."""
    x = inputs[0]
    return [x.broadcast_to(torch.broadcast_shapes(tuple(x.shape), tuple(_ints(inputs[1]))))]


def range_(inputs, attrs):
    """Range(start, limit, delta): max(ceil((limit - start) / delta), 0) values of start's type."""
    start, limit, delta = inputs[0], inputs[1], inputs[2]
    return [torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype, device=start.device)]


def constant_of_shape(inputs, attrs):
    """ConstantOfShape: ``value`` (a one-element tensor; default float32 0) repeated to the input shape."""
    value = np.zeros(1, np.float32) if "value" not in attrs else numpy_helper.to_array(attrs["value"])
    filled = torch.from_numpy(np.array(value).reshape(-1)[:1]).to(inputs[0].device)
    return [filled.reshape(()).expand(*_ints(inputs[0])).clone()]


def cast(inputs, attrs):
    """Cast to ``to``: float → integer truncates toward zero, as C's conversion and ONNX Runtime do."""
    return [inputs[0].to(DTYPES[attrs["to"]])]


def _pad_indices(size: int, begin: int, end: int, mode: str) -> list[int]:
    """Source index of each output position along one axis: positions -begin .. size + end - 1, mapped
    back into [0, size) by ``mode`` (edge: clamped; reflect: mirrored about the end elements, which are
    not repeated; wrap: modulo the size). A negative pad removes elements."""
    indices = []
    for position in range(-begin, size + end):
        if mode == "edge":
            indices.append(min(max(position, 0), size - 1))
        elif mode == "wrap":
            indices.append(position % size)
        else:  # reflect, with period 2·(size - 1)
            period = 2 * (size - 1)
            folded = position % period if period else 0
            indices.append(folded if folded < size else period - folded)
    return indices


def pad(inputs, attrs):
    """Pad (opset 11+): ``pads`` [x1_begin, x2_begin, ..., x1_end, x2_end] over ``axes`` (input 3; all
    axes when omitted), ``constant_value`` (input 2, default 0) for mode constant; modes edge, reflect and
    wrap read the tensor's own elements."""
    x = inputs[0]
    pads = _ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attrs.get("pads", []))
    axes = _ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(x.ndim))
    axes = [_positive_axis(a, x.ndim) for a in axes]
    mode = attrs.get("mode", "constant")
    n = len(axes)
    if mode == "constant":
        value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("value", 0.0)
        value = float(value.item()) if isinstance(value, torch.Tensor) else float(value)
        torch_pads = [0] * (2 * x.ndim)  # F.pad: (begin, end) per dim, the last dim first
        for i, axis in enumerate(axes):
            torch_pads[2 * (x.ndim - 1 - axis)] = pads[i]
            torch_pads[2 * (x.ndim - 1 - axis) + 1] = pads[i + n]
        return [F.pad(x, torch_pads, value=value)]
    for i, axis in enumerate(axes):
        if pads[i] or pads[i + n]:
            index = _pad_indices(x.shape[axis], pads[i], pads[i + n], mode)
            x = x.index_select(axis, torch.tensor(index, dtype=torch.int64, device=x.device))
    return [x]


def _check_cast(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    target = attrs.get("to")
    if target in DTYPES:
        return None
    name = TensorProto.DataType.Name(target) if target in TensorProto.DataType.values() else str(target)
    return f"Cast to {name}: no torch dtype computes it"


def _check_constant_of_shape(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    value = attrs.get("value")
    if value is None or value.data_type in DTYPES:
        return None
    return f"ConstantOfShape of {TensorProto.DataType.Name(value.data_type)}: no torch dtype computes it"


def _check_pad(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    mode = attrs.get("mode", "constant")
    return None if mode in ("constant", "edge", "reflect", "wrap") else f"Pad mode {mode!r} is not an ONNX mode"


OPS = {
    "Shape": shape,
    "Gather": gather,
    "Slice": slice_,
    "Expand": expand,
    "Range": range_,
    "ConstantOfShape": constant_of_shape,
    "Cast": cast,
    "Pad": pad,
}
CHECKS = {"Cast": _check_cast, "ConstantOfShape": _check_constant_of_shape, "Pad": _check_pad}
