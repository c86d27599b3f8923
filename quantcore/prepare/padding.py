"""``auto_pad`` SAME_UPPER / SAME_LOWER made explicit ``pads`` on Conv and pooling nodes.

TensorFlow exports (tf2onnx) carry ``auto_pad="SAME_UPPER"``; the torch converters that run
reconstruction blocks, and the Q/DQ fusions of some runtimes, only read explicit ``pads``. Per
spatial axis with input size n, kernel k, stride s, dilation r::

    out   = ceil(n / s)
    total = max((out - 1)·s + (k - 1)·r + 1 - n, 0)
    SAME_UPPER: begin = floor(total / 2), end = total - begin     (SAME_LOWER: the other way round)

With s = 1, total = (k - 1)·r whatever n is, so dynamic sizes are fine; with s > 1 the node is
rewritten only when its input's spatial size is known statically (otherwise it keeps ``auto_pad``,
which ONNX Runtime and TensorRT both run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import onnx
from onnx import helper

from quantcore.graph.index import GraphIndex

PADDED_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})
SAME = (b"SAME_UPPER", b"SAME_LOWER")


def _attribute(node: onnx.NodeProto, name: str):
    for attribute in node.attribute:
        if attribute.name == name:
            return attribute
    return None


def _pads(mode: bytes, sizes, kernel, strides, dilations) -> list[int] | None:
    begins, ends = [], []
    for axis, k in enumerate(kernel):
        s, r = strides[axis], dilations[axis]
        if s == 1:
            total = (k - 1) * r
        else:
            n = sizes[axis] if sizes is not None else None  # None: unknown statically
            if n is None:
                return None
            total = max((math.ceil(n / s) - 1) * s + (k - 1) * r + 1 - n, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == b"SAME_UPPER" else large)
        ends.append(large if mode == b"SAME_UPPER" else small)
    return begins + ends


def known_dims(graph: onnx.GraphProto) -> dict[str, tuple[int | None, ...]]:
    """Tensor name → its dimensions (None where not fixed), from graph inputs and inferred value_info."""
    dims = {}
    for value_info in [*graph.input, *graph.value_info]:
        tensor_type = value_info.type.tensor_type
        if value_info.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            dims[value_info.name] = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim
            )
    return dims


def explicit_auto_pad(graph: onnx.GraphProto, shapes: Mapping[str, tuple[int | None, ...]] | None = None) -> list[str]:
    """Rewrite SAME auto_pad to explicit pads where possible (formula in the module docstring);
    ``shapes``: tensor dimensions, None where unknown (default: ``known_dims(graph)``). Returns the
    rewritten node names. Mutates ``graph``."""
    shapes = known_dims(graph) if shapes is None else shapes
    index = GraphIndex(graph)
    rewritten = []
    for node in graph.node:
        auto_pad = _attribute(node, "auto_pad")
        if node.op_type not in PADDED_OPS or auto_pad is None or auto_pad.s not in SAME:
            continue
        kernel_attribute = _attribute(node, "kernel_shape")
        if kernel_attribute is not None:
            kernel = list(kernel_attribute.ints)
        elif node.op_type == "Conv" and index.is_initializer(node.input[1]):
            kernel = list(index.initializers[node.input[1]].dims[2:])
        else:
            continue
        spatial = len(kernel)
        strides = list(getattr(_attribute(node, "strides"), "ints", []) or [1] * spatial)
        dilations = list(getattr(_attribute(node, "dilations"), "ints", []) or [1] * spatial)
        shape = shapes.get(node.input[0])
        sizes = list(shape[2:]) if shape is not None and len(shape) == spatial + 2 else None
        pads = _pads(auto_pad.s, sizes, kernel, strides, dilations)
        if pads is None:
            continue
        node.attribute.remove(auto_pad)
        old_pads = _attribute(node, "pads")
        if old_pads is not None:
            node.attribute.remove(old_pads)
        node.attribute.append(helper.make_attribute("pads", pads))
        rewritten.append(node.name)
    return rewritten
