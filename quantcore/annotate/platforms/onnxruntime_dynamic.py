"""ONNX Runtime CPU EP, dynamic activations: int8 weights, and the activation a MatMul reads quantized
at run time from each batch's own range. What ``onnxruntime.quantization.quantize_dynamic`` gives a
transformer, as QDQ.

Only MatMul with a constant weight is quantized: ``DynamicQuantizeLinear → DequantizeLinear → MatMul``
with a ``DequantizeLinear`` of int8 weight codes is what the CPU EP fuses into its integer kernel
(DynamicQuantizeMatMul: with onnxruntime 1.32, a 384x1536 projection of 8x48 tokens on one thread ran
3.6 times faster than the float MatMul). The same pattern before a Gemm is not fused (it would run
the float Gemm on dequantized values, slower than float), and Conv has no fast dynamic kernel
(ConvInteger: 1.7 to 3.6 times slower than float on the bench's CNNs), so both stay float, with
everything else.

- activation: DynamicQuantizeLinear's own scheme, the only one ONNX defines: uint8, per tensor, the
  range [min(x, 0), max(x, 0)] of the value itself, scale = range / 255, zero point rounded half to
  even. Nothing to calibrate, and no calibration range to clip.
- weight: symmetric int8 per output channel (minmax), 7-bit where u8s8 kernels saturate, as on the
  static ``onnxruntime`` platform (``quantcore.runtime.cpu_features``).

Against static quantization: each batch gets its own range, so an outlier in one sentence costs that
sentence only, which is why transformers keep more accuracy this way; each quantized input costs a
pass over it at run time to find its range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from quantcore.annotate.platforms.onnxruntime import ONNXRUNTIME, weight
from quantcore.annotate.rules import Platform, Request, RuleContext, is_float_activation, operand, weight_axis
from quantcore.numerics.policy import make_policy
from quantcore.numerics.tqc import TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    """DynamicQuantizeLinear's scheme (8 bits: the precisions allow nothing else)."""
    return TensorQuantConfig(num_bits=bits, observer=observer, policy=make_policy(symmetric=False, dynamic=True))


def quantize_weighted_matmul(node: onnx.NodeProto, context: RuleContext) -> list[Request]:
    """A MatMul of a float activation by a float32 initializer: the activation dynamic, the weight
    per-channel on its last axis. Any other MatMul (attention's two activations) stays float."""
    if len(node.input) != 2 or not is_float_activation(node.input[0], context.index):
        return []
    weight_name = node.input[1]
    if not context.index.is_initializer(weight_name) or not context.index.is_float32(weight_name, unknown=False):
        return []
    return operand(node, 0, context, None) + operand(node, 1, context, weight_axis(node, context.index))


ONNXRUNTIME_DYNAMIC = Platform(
    name="onnxruntime-dynamic",
    rules={"MatMul": quantize_weighted_matmul},
    weight=weight,
    activation=activation,
    description="ONNX Runtime CPU EP, dynamic: MatMul inputs quantized at run time (DynamicQuantizeLinear, "
    "uint8), int8 symmetric per-channel weights; everything else float",
    notes=ONNXRUNTIME.notes,  # the weight range chosen for this CPU
    unsigned_weights=ONNXRUNTIME.unsigned_weights,
    reduced_range_remedy=True,
)
