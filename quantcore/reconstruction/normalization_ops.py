"""ONNX normalization ops as torch functions (``torch_ops.OPS`` convention): BatchNormalization in its
inference form (prepare folds it into a Conv where one precedes it alone; what remains reads a sum or a
graph input) and LayerNormalization (opset 17).
"""

from __future__ import annotations

from typing import Any

import onnx
import torch


def batch_normalization(inputs, attrs):
    """Inference BatchNormalization: y = (x - mean) / sqrt(var + epsilon) · scale + B, the four (C,)
    vectors along axis 1 (``epsilon`` default 1e-5; ``momentum`` concerns training only)."""
    x, scale, bias, mean, var = inputs[:5]
    shape = (1, -1) + (1,) * (x.ndim - 2)  # (1, C, 1, ...) broadcast over N and the spatial axes
    inverse = torch.rsqrt(var.reshape(shape) + attrs.get("epsilon", 1e-5))
    return [(x - mean.reshape(shape)) * inverse * scale.reshape(shape) + bias.reshape(shape)]


def layer_normalization(inputs, attrs):
    """LayerNormalization: over the axes ``axis`` (default -1) .. rank - 1, y = (x - μ) / sqrt(σ² +
    epsilon) · Scale + B, σ² the biased variance, ``epsilon`` default 1e-5; with ``stash_type`` 1 (the
    default) μ and σ² are computed in float32 whatever x's type. Outputs Y, Mean and InvStdDev (μ and
    1/sqrt(σ² + epsilon), the reduced axes kept as 1)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1)
    axis = axis + x.ndim if axis < 0 else axis
    dims = tuple(range(axis, x.ndim))
    stashed = x.float() if attrs.get("stash_type", 1) == 1 else x
    mean = stashed.mean(dim=dims, keepdim=True)
    centred = stashed - mean
    inverse = torch.rsqrt((centred * centred).mean(dim=dims, keepdim=True) + attrs.get("epsilon", 1e-5))
    y = (centred * inverse).to(x.dtype) * scale
    if bias is not None:
        y = y + bias
    return [y, mean, inverse]


def _check_batch_normalization(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    if attrs.get("training_mode", 0):
        return "BatchNormalization training_mode 1: only the inference form (running statistics) is converted"
    return None


OPS = {"BatchNormalization": batch_normalization, "LayerNormalization": layer_normalization}
CHECKS = {"BatchNormalization": _check_batch_normalization}
