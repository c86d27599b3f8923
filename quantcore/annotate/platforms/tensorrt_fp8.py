"""TensorRT FP8 (E4M3) explicit quantization, as TensorRT 10 runs it.

The same placement as ``tensorrt`` (inputs of Conv/ConvTranspose/Gemm/MatMul, the residual input of
an Add fused into its weighted layer, element-wise ops and Concat read in FP8, pooling inputs;
LayerNorm/Softmax float), with FP8 E4M3FN in place of
int8: x̂ = s · fp8(clip(x / s, -448, 448)), s = amax / 448. Activations per-tensor, weights
per-channel on the output-channel axis (TensorRT 10 accepts per-channel FP8 weight scales).
Exported as QuantizeLinear/DequantizeLinear with float8e4m3fn zero points (opset 19; per-channel
float8 DequantizeLinear at opset 21, see ``quantcore.export.qdq``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantcore.annotate.platforms.tensorrt import RULES
from quantcore.annotate.rules import Platform
from quantcore.errors import UnsupportedModelError
from quantcore.numerics.precision import FP8_EXPONENT_BITS
from quantcore.numerics.tqc import TensorQuantConfig

if TYPE_CHECKING:
    from quantcore.config import QuantizeConfig


def _fp8(*, per_channel: bool, axis: int | None, observer: str) -> TensorQuantConfig:
    """An E4M3 config; needs the floating support of ``quantcore.numerics.tqc`` (policy, exponent_bits)."""
    try:
        from quantcore.numerics.policy import make_policy

        return TensorQuantConfig(
            policy=make_policy(floating=True, per_channel=per_channel),
            num_bits=8,
            exponent_bits=FP8_EXPONENT_BITS,
            channel_axis=axis,
            observer=observer,
        )
    except (ImportError, TypeError) as error:
        raise UnsupportedModelError(
            f"platform tensorrt-fp8 needs FP8 TensorQuantConfig support (policy FLOATING, exponent_bits), "
            f"which this quantcore.numerics.tqc lacks: {error}"
        ) from error


def activation(bits: int, observer: str, config: QuantizeConfig) -> TensorQuantConfig:
    """Per-tensor E4M3 (``bits`` is always 8 for fp8)."""
    return _fp8(per_channel=False, axis=None, observer=observer)


def weight(axis: int | None, bits: int, config: QuantizeConfig) -> TensorQuantConfig:
    """E4M3 per-channel on ``axis`` (per-tensor if None), s[c] = amax[c] / 448 from minmax."""
    return _fp8(per_channel=axis is not None, axis=axis, observer="minmax")


TENSORRT_FP8 = Platform(
    name="tensorrt-fp8",
    rules=RULES,
    weight=weight,
    activation=activation,
    description="TensorRT FP8 E4M3: per-channel weights, per-tensor activations, TensorRT's placement",
    floating=True,
)
