"""ONNX ops as torch functions: what a reconstruction block and the QAT graph are executed with.

``OPS[op_type](inputs, attrs)`` → list of outputs, where ``inputs`` are torch tensors (None for an
omitted optional input) and ``attrs`` the node's attributes as plain Python values. This module holds the
compute ops with a weight (Conv incl. grouped and depthwise, Gemm, MatMul, ConvTranspose), elementwise
arithmetic and activations, pooling and reductions, and gathers the tables of the modules beside it:
``shape_ops`` (shape, index and type ops), ``normalization_ops``, ``resize_ops`` and ``recurrent_ops``.

``unsupported(node)`` is the one support decision: None when ``OPS`` holds the op and the node's
attributes are ones its function reproduces (each module's ``CHECKS``), else the reason, naming the op
and the attribute. A block with such a node stays at round-to-nearest and QAT is skipped
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

from quantcore.reconstruction import normalization_ops, recurrent_ops, resize_ops, shape_ops

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


def _reduce(function: Callable[..., torch.Tensor]) -> OpFn:
    """A Reduce* op: over ``axes`` (input 1 from opset 13/18, else the attribute; all axes when omitted or
    empty, unless ``noop_with_empty_axes``, which then returns the input), keeping the reduced axes as 1
    with ``keepdims`` (default 1)."""

    def reduce(inputs, attrs):
        x, axes = inputs[0], _axes(inputs, attrs)
        if not axes and attrs.get("noop_with_empty_axes", 0):
            return [x]
        return [function(x, dim=tuple(axes or range(x.ndim)), keepdim=bool(attrs.get("keepdims", 1)))]

    return reduce


def div(inputs, attrs):
    """Div; on integer tensors the quotient truncated toward zero (ONNX Runtime's C++ integer division),
    where torch's ``/`` would return floats."""
    a, b = inputs[0], inputs[1]
    if a.is_floating_point() or b.is_floating_point():
        return [torch.div(a, b)]
    return [torch.div(a, b, rounding_mode="trunc")]


def sqrt(inputs, attrs):
    """Sqrt whose gradient stays finite at 0: the argument is clamped to the smallest normal float
    (1.2e-38 in float32) first, which moves the value at 0 to 1.1e-19 and makes its gradient 0 where
    torch's is infinite (and NaN once multiplied by a zero upstream gradient). Measured: without it,
    silero-vad's QAT loss became NaN at the second step (its spectrum magnitude is the Sqrt of a sum of
    squares that quantization can make exactly 0). A negative argument still gives NaN, as in ONNX."""
    x = inputs[0]
    root = torch.sqrt(x.clamp_min(torch.finfo(x.dtype).tiny))
    return [torch.where(x < 0, torch.full_like(root, math.nan), root)]


def power(inputs, attrs):
    """Pow: the result has the base's type (an integer exponent does not promote a float base, a float
    exponent does not turn an integer base into floats)."""
    return [torch.pow(inputs[0], inputs[1]).to(inputs[0].dtype)]


def _check_auto_pad(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID") or node.op_type == "ConvTranspose":
        return None
    return f"{node.op_type} auto_pad {auto_pad}: pads must be explicit (prepare makes them so)"


def _check_average_pool(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    if any(d != 1 for d in attrs.get("dilations", [])):
        return "AveragePool with dilations: torch's average pooling has none"
    return _check_auto_pad(node, attrs)


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
    "Div": div,
    "Pow": power,
    "Relu": _unary(torch.relu),
    "Sigmoid": _unary(torch.sigmoid),
    "Tanh": _unary(torch.tanh),
    "Erf": _unary(torch.erf),
    "Sqrt": sqrt,
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
    "ReduceMean": _reduce(torch.mean),
    "ReduceSum": _reduce(torch.sum),
    "ReduceL2": _reduce(torch.linalg.vector_norm),
    "Flatten": flatten,
    "Reshape": reshape,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Transpose": lambda inputs, attrs: [inputs[0].permute(*attrs.get("perm", list(reversed(range(inputs[0].ndim)))))],
    "Concat": lambda inputs, attrs: [torch.cat([t for t in inputs if t is not None], dim=attrs["axis"])],
    **shape_ops.OPS,
    **normalization_ops.OPS,
    **resize_ops.OPS,
    **recurrent_ops.OPS,
}
CHECKS: dict[str, Callable[[onnx.NodeProto, dict[str, Any]], str | None]] = {
    "Conv": _check_auto_pad,
    "MaxPool": _check_auto_pad,
    "AveragePool": _check_average_pool,
    **shape_ops.CHECKS,
    **normalization_ops.CHECKS,
    **resize_ops.CHECKS,
    **recurrent_ops.CHECKS,
}


def unsupported(node: onnx.NodeProto) -> str | None:
    """Why ``node`` cannot be run by ``OPS`` ("<op>: ..." naming the attribute or input at fault), or None
    when it can."""
    if node.domain not in ("", "ai.onnx"):
        return f"{node.op_type} (domain {node.domain}): no torch converter"
    if node.op_type not in OPS:
        return f"{node.op_type}: no torch converter"
    check = CHECKS.get(node.op_type)
    return None if check is None else check(node, node_attributes(node))
