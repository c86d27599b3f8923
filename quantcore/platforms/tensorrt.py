"""TensorRT INT8 explicit quantization: where Q/DQ go so that TensorRT fuses them.

- Conv, ConvTranspose, Gemm, MatMul (``quantize_compute``): the activation input per-tensor symmetric
  int8, q = clip(round(x / s), -128, 127) with s = amax / 127 (amax from the run's observer); a weight
  initializer per-channel symmetric int8 on its output-channel axis (Conv W axis 0, depthwise and
  grouped included; ConvTranspose W axis 1; Gemm B axis 0 with transB=1, 1 without; MatMul B its last
  axis), amax per channel from minmax. A MatMul of two activations (attention) quantizes both.
  Biases stay float (TensorRT quantizes them itself).
- Add/Mul of two activations (a residual join): both inputs; TensorRT fuses the DQs into the
  element-wise layer. Concat: inputs share one scale (``dominator``) so the concat is a copy.
- AveragePool/GlobalAveragePool: the input, so the pool runs in int8.
- Identity-like ops pass through; everything else (Softmax, LayerNormalization, Sigmoid, ...) stays
  float.

Only float32 tensors are quantized (QuantizeLinear-13 takes float32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantcore.rules import (
    DATA_MOVEMENT_OPS,
    Platform,
    Rule,
    pass_through,
    quantize_compute,
    quantize_elementwise,
    quantize_first_input,
    quantize_shared_inputs,
)
from quantcore.tqc import TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig

# Data movement, and activations TensorRT fuses into the preceding layer.
PASS_THROUGH_OPS = DATA_MOVEMENT_OPS | {"Relu", "Clip", "LeakyRelu"}


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    """Per-tensor symmetric int8 (offset 0)."""
    return TensorQuantConfig(num_bits=bits, symmetric=True, observer=observer)


def weight(axis: int | None, bits: int, config: QuantizeConfig) -> TensorQuantConfig:
    """Symmetric int8, per-channel on ``axis`` (per-tensor if None); range from minmax."""
    if axis is None:
        return TensorQuantConfig(num_bits=bits, symmetric=True, observer="minmax")
    return TensorQuantConfig(num_bits=bits, symmetric=True, per_channel=True, channel_axis=axis, observer="minmax")


RULES: dict[str, Rule] = {
    "Conv": quantize_compute,
    "ConvTranspose": quantize_compute,
    "Gemm": quantize_compute,
    "MatMul": quantize_compute,
    "Add": quantize_elementwise,
    "Mul": quantize_elementwise,
    "Concat": quantize_shared_inputs,
    "AveragePool": quantize_first_input,
    "GlobalAveragePool": quantize_first_input,
    **{op_type: pass_through for op_type in PASS_THROUGH_OPS},
}

TENSORRT = Platform(
    name="tensorrt",
    rules=RULES,
    weight=weight,
    activation=activation,
    description="TensorRT INT8: symmetric per-channel weights, symmetric per-tensor activations, "
    "Q/DQ at the inputs of Conv/Gemm/MatMul, residual Add/Mul, Concat and pooling",
)
