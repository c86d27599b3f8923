"""ONNX ops as torch functions: what a reconstruction block is executed with.

``OPS[op_type](inputs, attrs)`` → list of outputs, where ``inputs`` are torch tensors (None for an
omitted optional input) and ``attrs`` the node's attributes as plain Python values. Only ops that
reconstruction blocks hold are here: compute ops with a weight (Conv incl. grouped and depthwise, Gemm,
MatMul, ConvTranspose), elementwise arithmetic and activations, pooling, and the shape ops between them. A node whose
op is not in the table makes its block unconvertible; the block then stays at round-to-nearest
(``quantcore.reconstruction.blocks``), never failing the run. Semantics follow the ONNX operator
specification (opset 13 and later): explicit ``pads`` as [x1_begin, x2_begin, ..., x1_end, x2_end]
(prepare has made ``auto_pad`` explicit), ``Clip`` bounds and ``Reshape`` shape as inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import onnx
import torch
import torch.nn.functional as F

OpFn = Callable[[Sequence[torch.Tensor | None], dict[str, Any]], list[torch.Tensor]]


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """Attribute name → Python value (bytes decoded to str, tensors left as TensorProto)."""
    values = {}
    for attribute in node.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        values[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return values


def _pad(x: torch.Tensor, pads: Sequence[int], value: float = 0.0) -> torch.Tensor:
    """Apply ONNX spatial pads [b1, b2, ..., e1, e2] to the trailing dims of x (N, C, *spatial)."""
    n = len(pads) // 2
    torch_pads: list[int] = []
    for axis in reversed(range(n)):  # F.pad takes the last dim first: (begin, end) per dim
        torch_pads += [pads[axis], pads[axis + n]]
    return F.pad(x, torch_pads, value=value) if any(torch_pads) else x


def _spatial_args(x: torch.Tensor, attrs: dict[str, Any]) -> tuple[list, list, list]:
    dims = x.ndim - 2
    strides = list(attrs.get("strides", [1] * dims))
    dilations = list(attrs.get("dilations", [1] * dims))
    pads = list(attrs.get("pads", [0] * (2 * dims)))
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise NotImplementedError("auto_pad SAME_* (prepare makes pads explicit)")
    return strides, dilations, pads


def conv(inputs, attrs):
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    strides, dilations, pads = _spatial_args(x, attrs)
    function = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[x.ndim - 2]
    return [function(_pad(x, pads), w, bias, strides, 0, dilations, attrs.get("group", 1))]


def conv_transpose(inputs, attrs):
    """ONNX ConvTranspose: W (C_in, C_out/group, k...). Per spatial axis with input size n, the full
    output has s·(n - 1) + output_padding + (k - 1)·d + 1 elements, from which ``pads`` [b..., e...]
    are cropped; with ``output_shape`` or ``auto_pad`` SAME_* the pads come from the spec's
    total = full - target (SAME: target n·s), the larger half at the end for SAME_UPPER, at the
    beginning otherwise."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    dims = x.ndim - 2
    strides = list(attrs.get("strides", [1] * dims))
    dilations = list(attrs.get("dilations", [1] * dims))
    output_padding = list(attrs.get("output_padding", [0] * dims))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    pads = list(attrs.get("pads", [0] * (2 * dims)))
    if "output_shape" in attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = x.shape[2:]
        full = [
            s * (n - 1) + p + (k - 1) * d + 1
            for s, n, p, k, d in zip(strides, sizes, output_padding, w.shape[2:], dilations, strict=True)
        ]
        target = (
            list(attrs["output_shape"])[-dims:]
            if "output_shape" in attrs
            else [n * s for n, s in zip(sizes, strides, strict=True)]
        )
        total = [f - t for f, t in zip(full, target, strict=True)]
        if any(t < 0 for t in total):
            raise NotImplementedError("ConvTranspose output_shape larger than the full output")
        small = [t // 2 for t in total]
        large = [t - t // 2 for t in total]
        pads = [*small, *large] if auto_pad == "SAME_UPPER" else [*large, *small]
    function = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[dims]
    y = function(x, w, bias, strides, 0, output_padding, attrs.get("group", 1), dilations)
    crop = [slice(None), slice(None)]
    crop += [slice(pads[axis], y.shape[2 + axis] - pads[axis + dims]) for axis in range(dims)]
    return [y[tuple(crop)]]


def gemm(inputs, attrs):
    a, b = inputs[0], inputs[1]
    a = a.t() if attrs.get("transA", 0) else a
    b = b.t() if attrs.get("transB", 0) else b
    y = attrs.get("alpha", 1.0) * (a @ b)
    if len(inputs) > 2 and inputs[2] is not None:
        y = y + attrs.get("beta", 1.0) * inputs[2]
    return [y]


def _pool(x: torch.Tensor, attrs: dict[str, Any], kind: str) -> torch.Tensor:
    kernel = list(attrs["kernel_shape"])
    strides, dilations, pads = _spatial_args(x, attrs)
    dims = x.ndim - 2
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    if kind == "max":
        function = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[dims]
        return function(_pad(x, pads, -math.inf), kernel, strides, 0, dilations, ceil_mode)
    if any(d != 1 for d in dilations):
        raise NotImplementedError("dilated AveragePool")
    function = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[dims]
    if attrs.get("count_include_pad", 0):
        return function(_pad(x, pads), kernel, strides, 0, ceil_mode, True)
    total = function(_pad(x, pads), kernel, strides, 0, ceil_mode, True)  # sum / kernel size
    count = function(_pad(torch.ones_like(x[:1, :1]), pads), kernel, strides, 0, ceil_mode, True)
    return total / count  # mean over the unpadded elements of each window


def clip(inputs, attrs):
    x = inputs[0]
    lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("min")
    hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("max")
    return [torch.clamp(x, None if lo is None else float(lo), None if hi is None else float(hi))]


def reshape(inputs, attrs):
    x, shape = inputs[0], [int(v) for v in inputs[1].tolist()]
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return [x.reshape(shape)]


def flatten(inputs, attrs):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), -1)]


def _axes(inputs, attrs) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(v) for v in inputs[1].tolist()]
    return list(attrs["axes"]) if "axes" in attrs else None


def squeeze(inputs, attrs):
    axes = _axes(inputs, attrs)
    return [inputs[0].squeeze() if axes is None else inputs[0].squeeze(tuple(axes))]


def unsqueeze(inputs, attrs):
    x = inputs[0]
    rank = x.ndim + len(_axes(inputs, attrs))
    for axis in sorted(a % rank for a in _axes(inputs, attrs)):
        x = x.unsqueeze(axis)
    return [x]


def reduce_mean(inputs, attrs):
    axes = _axes(inputs, attrs)
    keep = bool(attrs.get("keepdims", 1))
    x = inputs[0]
    return [x.mean() if axes is None and not keep else x.mean(dim=tuple(axes or range(x.ndim)), keepdim=keep)]


def _unary(function: Callable[[torch.Tensor], torch.Tensor]) -> OpFn:
    return lambda inputs, attrs: [function(inputs[0])]


def _binary(function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> OpFn:
    return lambda inputs, attrs: [function(inputs[0], inputs[1])]


OPS: dict[str, OpFn] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "Gemm": gemm,
    "MatMul": _binary(torch.matmul),
    "Add": _binary(torch.add),
    "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul),
    "Div": _binary(torch.div),
    "Relu": _unary(torch.relu),
    "Sigmoid": _unary(torch.sigmoid),
    "Tanh": _unary(torch.tanh),
    "Erf": _unary(torch.erf),
    "Sqrt": _unary(torch.sqrt),
    "Neg": _unary(torch.neg),
    "Identity": _unary(lambda x: x),
    "Dropout": lambda inputs, attrs: [inputs[0]],  # inference: identity
    "LeakyRelu": lambda inputs, attrs: [F.leaky_relu(inputs[0], attrs.get("alpha", 0.01))],
    "HardSigmoid": lambda inputs, attrs: [
        torch.clamp(attrs.get("alpha", 0.2) * inputs[0] + attrs.get("beta", 0.5), 0.0, 1.0)
    ],
    "HardSwish": _unary(F.hardswish),
    "Clip": clip,
    "Softmax": lambda inputs, attrs: [torch.softmax(inputs[0], attrs.get("axis", -1))],
    "MaxPool": lambda inputs, attrs: [_pool(inputs[0], attrs, "max")],
    "AveragePool": lambda inputs, attrs: [_pool(inputs[0], attrs, "avg")],
    "GlobalAveragePool": _unary(lambda x: x.mean(dim=tuple(range(2, x.ndim)), keepdim=True)),
    "GlobalMaxPool": _unary(lambda x: x.amax(dim=tuple(range(2, x.ndim)), keepdim=True)),
    "ReduceMean": reduce_mean,
    "Flatten": flatten,
    "Reshape": reshape,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Transpose": lambda inputs, attrs: [inputs[0].permute(*attrs.get("perm", list(reversed(range(inputs[0].ndim)))))],
    "Concat": lambda inputs, attrs: [torch.cat([t for t in inputs if t is not None], dim=attrs["axis"])],
}
