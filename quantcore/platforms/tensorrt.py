"""TensorRT INT8 explicit quantization: where Q/DQ go so that TensorRT fuses them.

- Conv, ConvTranspose, Gemm, MatMul: the activation input per-tensor symmetric int8 (observer from
  the run's config); a weight initializer per-channel symmetric int8 on its output-channel axis:
  Conv W (C_out, C_in/g, k...) axis 0; ConvTranspose W (C_in, C_out/g, k...) axis 1;
  Gemm B (N, K) axis 0 with transB=1, (K, N) axis 1 with transB=0; MatMul B (..., K, N) last axis.
  Weight ranges use minmax (amax per channel, scale = amax / 127). Biases stay float (TensorRT
  quantizes them itself).
- Add of two activations (a residual connection): both inputs quantized; TensorRT fuses the DQs
  into the element-wise layer.
- Identity-like ops pass through; everything else (Softmax, LayerNormalization, ...) stays float.

Only float32 tensors are quantized (QuantizeLinear-13 takes float32).
"""

from __future__ import annotations

import onnx
from onnx import helper

from quantcore.config import QuantizeConfig
from quantcore.graph import GraphIndex
from quantcore.rules import Platform, QuantRequest, Rule, pass_through
from quantcore.tqc import TensorQuantConfig


def _activation(config: QuantizeConfig) -> TensorQuantConfig:
    return TensorQuantConfig(num_bits=8, symmetric=True, observer=config.observer)


def _weight(axis: int | None) -> TensorQuantConfig:
    if axis is None:
        return TensorQuantConfig(num_bits=8, symmetric=True, observer="minmax")
    return TensorQuantConfig(num_bits=8, symmetric=True, per_channel=True, channel_axis=axis, observer="minmax")


def _operand(
    node: onnx.NodeProto, position: int, index: GraphIndex, config: QuantizeConfig, weight_axis: int | None
) -> list[QuantRequest]:
    """Request for one operand: per-channel weight (axis ``weight_axis``) if it is an initializer,
    per-tensor activation otherwise; nothing if it isn't float32."""
    if len(node.input) <= position or not node.input[position]:
        return []
    name = node.input[position]
    if index.is_initializer(name):
        if not index.is_float32(name, unknown=False):
            return []
        return [QuantRequest(position, _weight(weight_axis))]
    if index.is_constant(name) or not index.is_float32(name, unknown=True):
        return []
    return [QuantRequest(position, _activation(config))]


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(helper.get_attribute_value(attribute))
    return default


def quantize_conv(node: onnx.NodeProto, index: GraphIndex, config: QuantizeConfig) -> list[QuantRequest]:
    """Conv (weight axis 0) and ConvTranspose (weight axis 1): input and weight."""
    axis = 1 if node.op_type == "ConvTranspose" else 0
    return _operand(node, 0, index, config, None) + _operand(node, 1, index, config, axis)


def quantize_gemm(node: onnx.NodeProto, index: GraphIndex, config: QuantizeConfig) -> list[QuantRequest]:
    """Gemm: A per-tensor; B per-channel on N (axis 0 if transB else 1). C (bias) stays float."""
    b_axis = 0 if _attribute(node, "transB", 0) else 1
    return _operand(node, 0, index, config, None) + _operand(node, 1, index, config, b_axis)


def quantize_matmul(node: onnx.NodeProto, index: GraphIndex, config: QuantizeConfig) -> list[QuantRequest]:
    """MatMul: A per-tensor; a constant B (..., K, N) per-channel on its last axis (N), per-tensor if 1-D."""
    b_axis = None
    if len(node.input) > 1 and index.is_initializer(node.input[1]):
        rank = len(index.initializers[node.input[1]].dims)
        b_axis = rank - 1 if rank >= 2 else None
    return _operand(node, 0, index, config, None) + _operand(node, 1, index, config, b_axis)


def quantize_residual_add(node: onnx.NodeProto, index: GraphIndex, config: QuantizeConfig) -> list[QuantRequest]:
    """Add of two float32 activations (a residual join): both inputs per-tensor. A bias add (one
    constant input) or an Add whose types are unknown stays float."""
    if len(node.input) != 2:
        return []
    for name in node.input:
        if not name or index.is_constant(name) or not index.is_float32(name, unknown=False):
            return []
    return [QuantRequest(0, _activation(config)), QuantRequest(1, _activation(config))]


PASS_THROUGH_OPS = (
    "Identity",
    "Relu",
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "MaxPool",
    "Slice",
    "Split",
    "Pad",
    "Expand",
    "Tile",
    "Dropout",
)

RULES: dict[str, Rule] = {
    "Conv": quantize_conv,
    "ConvTranspose": quantize_conv,
    "Gemm": quantize_gemm,
    "MatMul": quantize_matmul,
    "Add": quantize_residual_add,
    **{op_type: pass_through for op_type in PASS_THROUGH_OPS},
}

TENSORRT = Platform(name="tensorrt", rules=RULES)
