"""The academic PTQ protocol (the published AdaRound / BRECQ / QDrop tables): any bit width 2-8.

- weights: asymmetric per-channel on the output-channel axis, ``weight_bits`` of the precision
  (w4a4 → 4), q = clip(round(W / s) + o, 0, 2^b - 1), range from minmax per channel;
- activations: asymmetric per-tensor at ``activation_bits``, the run's observer;
- the first and the last compute layer (Conv/ConvTranspose/Gemm/MatMul, in graph order) at 8 bit,
  weights and the activation they read (``boundary_bits``), as every paper of that line does;
- placement as ``tensorrt``: inputs of compute ops, residual Add/Mul, Concat with a shared scale,
  pooling inputs; LayerNorm/Softmax/Sigmoid float.

Export stores 2-4 bit tensors as int4/uint4 (opset 21) and 5-8 bit ones as int8/uint8, with the
narrower quant range enforced by the stored codes (weights) or a Clip before QuantizeLinear
(activations). ONNX Runtime runs it for simulation; no runtime has fused kernels for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantcore.annotate.platforms.tensorrt import RULES
from quantcore.annotate.rules import Platform
from quantcore.numerics.tqc import TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig

BOUNDARY_BITS = 8


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    return TensorQuantConfig(num_bits=bits, symmetric=False, observer=observer)


def weight(axis: int | None, bits: int, config: QuantizeConfig) -> TensorQuantConfig:
    if axis is None:
        return TensorQuantConfig(num_bits=bits, symmetric=False, observer="minmax")
    return TensorQuantConfig(num_bits=bits, symmetric=False, per_channel=True, channel_axis=axis, observer="minmax")


ACADEMIC = Platform(
    name="academic",
    rules=RULES,
    weight=weight,
    activation=activation,
    description="academic protocol: 2-8 bit asymmetric per-channel weights, asymmetric activations, "
    "first and last layer at 8 bit",
    boundary_bits=BOUNDARY_BITS,
)
