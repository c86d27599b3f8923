"""How a quantized tensor is stored in ONNX: the element type of QuantizeLinear's output and the
opset that first allows it (registry as data, ``STORAGE_TYPES``).

    type          ONNX TensorProto   range              QuantizeLinear opset
    int8, uint8   INT8, UINT8        [-128,127] [0,255] 10 per-tensor, 13 per-channel (axis attribute)
    float8e4m3fn  FLOAT8E4M3FN       ±448               19
    float8e5m2    FLOAT8E5M2         ±57344             19
    int4, uint4   INT4, UINT4        [-8,7] [0,15]      21
    int16, uint16 INT16, UINT16      16-bit             21

(ONNX operator changelog: QuantizeLinear-13 added ``axis``, -19 the float8 types, -21 int4/uint4/
int16/uint16 and blocked quantization; ONNX 1.16 release notes.) Signed types for configs with
quant_min < 0, unsigned otherwise.

A bit width with no ONNX type of its own (2, 3, 5, 6, 7, 9-15 bits) is stored in the next wider type
with the config's restricted quant range: a 3-bit symmetric config ([-4, 3]) is stored as int4 (or int8
with ``allow_int4=False``). Weights baked as codes stay inside [-4, 3] exactly; an activation quantized
at run time by QuantizeLinear saturates at the *type's* range, so the exporter must bound it (a Clip
to [-4·s, 3·s] before the Q node) when the restricted range matters. ``storage_type(tqc)`` refuses
such widths unless ``widen=True``, so that widening is a decision of the caller.

int8 codes may also be stored shifted into uint8 (q + 128, zero point + 128: the same dequantized
values), for ONNX Runtime's u8u8 kernels on CPUs where its u8s8 ones saturate (``unsigned_twin``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import onnx

from quantcore.errors import UnsupportedModelError
from quantcore.numerics.tqc import TensorQuantConfig


@dataclass(frozen=True)
class StorageType:
    """An ONNX element type for quantized values: ``name`` (as in the table), ``onnx_type``
    (``onnx.TensorProto`` enum), ``bits``, ``signed``, and ``min_opset`` for QuantizeLinear/
    DequantizeLinear of this config (depends on per-channel for int8/uint8)."""

    name: str
    onnx_type: int
    bits: int
    signed: bool
    min_opset: int

    def __post_init__(self) -> None:
        if self.name not in STORAGE_TYPES:
            raise ValueError(f"unknown storage type {self.name!r}; choose from {sorted(STORAGE_TYPES)}")


# name → (onnx type, bits, signed, opset per-tensor, opset per-channel)
STORAGE_TYPES: dict[str, tuple[int, int, bool, int, int]] = {
    "int8": (onnx.TensorProto.INT8, 8, True, 10, 13),
    "uint8": (onnx.TensorProto.UINT8, 8, False, 10, 13),
    "int4": (onnx.TensorProto.INT4, 4, True, 21, 21),
    "uint4": (onnx.TensorProto.UINT4, 4, False, 21, 21),
    "int16": (onnx.TensorProto.INT16, 16, True, 21, 21),
    "uint16": (onnx.TensorProto.UINT16, 16, False, 21, 21),
    "float8e4m3fn": (onnx.TensorProto.FLOAT8E4M3FN, 8, True, 19, 19),
    "float8e5m2": (onnx.TensorProto.FLOAT8E5M2, 8, True, 19, 19),
}
LINEAR_WIDTHS = (4, 8, 16)  # integer widths ONNX QuantizeLinear can produce
UNSIGNED_SHIFT = 128  # int8 codes + 128 are the uint8 codes of the same grid (the zero point moves alike)


def _make(name: str, per_channel: bool) -> StorageType:
    onnx_type, bits, signed, opset_tensor, opset_channel = STORAGE_TYPES[name]
    return StorageType(name, onnx_type, bits, signed, opset_channel if per_channel else opset_tensor)


def unsigned_twin(storage: StorageType) -> StorageType:
    """uint8 for ``storage`` int8: the type int8 codes are stored in once shifted by ``UNSIGNED_SHIFT``
    (for kernels that read unsigned weights)."""
    if storage.name != "int8":
        raise ValueError(f"only int8 codes have an unsigned twin, not {storage.name}")
    onnx_type, _, signed, _, _ = STORAGE_TYPES["uint8"]  # same opsets as int8: the rest carries over
    return replace(storage, name="uint8", onnx_type=onnx_type, signed=signed)


def storage_type(tqc: TensorQuantConfig, *, widen: bool = False, allow_int4: bool = True) -> StorageType:
    """The ONNX type that stores ``tqc``'s quantized values.

    Floating: float8e4m3fn (exponent_bits 4) or float8e5m2 (5). Linear: int/uint of exactly
    ``num_bits`` for 4, 8, 16 bits; other widths raise ``UnsupportedModelError`` unless ``widen``,
    which picks the narrowest wider type (int4 for 2-3 bits, int8 for 5-7, int16 for 9-15; with
    ``allow_int4=False`` 2-3 bits and 4 bits go to int8 too), keeping the config's restricted
    quant range (3-bit symmetric: codes in [-4, 3] stored as int4, or as int8 without int4).
    """
    if tqc.floating:
        name = {4: "float8e4m3fn", 5: "float8e5m2"}.get(tqc.exponent_bits)
        if name is None or tqc.num_bits != 8:
            raise UnsupportedModelError(
                f"E{tqc.exponent_bits}M{tqc.mantissa_bits} has no ONNX type; use exponent_bits 4 or 5 at 8 bits"
            )
        return _make(name, tqc.per_channel)
    widths = [w for w in LINEAR_WIDTHS if allow_int4 or w != 4]
    if tqc.num_bits in widths:
        bits = tqc.num_bits
    elif widen:
        bits = min(w for w in widths if w >= tqc.num_bits)
    else:
        wider = min(w for w in widths if w >= tqc.num_bits)
        raise UnsupportedModelError(
            f"ONNX has no {tqc.num_bits}-bit integer type; store it in {wider}-bit with quant range "
            f"[{tqc.quant_min}, {tqc.quant_max}]: call storage_type(tqc, widen=True)"
        )
    signed = tqc.quant_min < 0
    return _make(f"{'' if signed else 'u'}int{bits}", tqc.per_channel)
