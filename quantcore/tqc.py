"""One tensor's quantization: `TensorQuantConfig` and its life-cycle `QuantState`.

Linear quantization of a tensor x with scale s and offset o (the seed's formula, also ONNX
QuantizeLinear/DequantizeLinear with round-half-to-even)::

    q = clip(round(x / s) + o, quant_min, quant_max)        x̂ = (q - o) · s

Per-channel: s and o are vectors of length C = x.shape[channel_axis], broadcast along that axis.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from quantcore.checks import require_bool, require_int
from quantcore.observers import OBSERVERS


class QuantState(enum.Enum):
    """Life cycle of one tensor's quantization (the PPQ seed's states).

    INITIAL: annotated, no scale yet.  ACTIVATED: scale/offset calibrated, quantization active.
    BAKED: a parameter already stored in quantized form (int8 initializer).  OVERLAPPED: another TQC
    on the same tensor takes precedence.  PASSIVE: scale derived from another tensor (``dominator``).
    FP32: deliberately left in float.
    """

    INITIAL = "initial"
    ACTIVATED = "activated"
    BAKED = "baked"
    OVERLAPPED = "overlapped"
    PASSIVE = "passive"
    FP32 = "fp32"


_STATES_WITH_SCALE = frozenset({QuantState.ACTIVATED, QuantState.BAKED, QuantState.PASSIVE, QuantState.OVERLAPPED})


def _signed_range(num_bits: int) -> tuple[int, int]:
    return -(2 ** (num_bits - 1)), 2 ** (num_bits - 1) - 1


@dataclass(frozen=True, eq=False)
class TensorQuantConfig:
    """How one tensor is quantized.

    Symmetric configs are signed with offset 0 and by default quant range [-2^(b-1), 2^(b-1)-1]
    (int8: [-128, 127], what ONNX QuantizeLinear saturates to); asymmetric ones default to unsigned
    [0, 2^b - 1]. ``scale`` is stored as a read-only float32 array, shape () per-tensor or (C,)
    per-channel; ``offset`` as a read-only int32 array of the same shape. ``dominator`` names the
    tensor whose scale this one shares (resolved during calibration; state becomes PASSIVE).
    """

    num_bits: int = 8
    symmetric: bool = True
    per_channel: bool = False
    channel_axis: int | None = None
    observer: str = "minmax"
    quant_min: int | None = None
    quant_max: int | None = None
    scale: np.ndarray | float | None = None
    offset: np.ndarray | int | None = None
    state: QuantState = QuantState.INITIAL
    dominator: str | None = None

    def __post_init__(self) -> None:
        require_int("num_bits", self.num_bits)
        if not 2 <= self.num_bits <= 8:
            raise ValueError(f"num_bits must be in [2, 8], got {self.num_bits}")
        require_bool("symmetric", self.symmetric)
        require_bool("per_channel", self.per_channel)
        if self.per_channel:
            require_int("channel_axis", self.channel_axis)
        elif self.channel_axis is not None:
            raise ValueError("channel_axis must be None when per_channel is False")
        if self.observer not in OBSERVERS:
            raise ValueError(f"observer must be one of {sorted(OBSERVERS)}, got {self.observer!r}")
        if not isinstance(self.state, QuantState):
            raise ValueError(f"state must be a QuantState, got {self.state!r}")
        if self.dominator is not None and (not isinstance(self.dominator, str) or not self.dominator):
            raise ValueError(f"dominator must be a non-empty tensor name or None, got {self.dominator!r}")
        self._validate_range()
        self._normalize_scale_offset()

    def _validate_range(self) -> None:
        lo_signed, hi_signed = _signed_range(self.num_bits)
        default = (lo_signed, hi_signed) if self.symmetric else (0, 2**self.num_bits - 1)
        quant_min = default[0] if self.quant_min is None else self.quant_min
        quant_max = default[1] if self.quant_max is None else self.quant_max
        require_int("quant_min", quant_min)
        require_int("quant_max", quant_max)
        if quant_min >= quant_max:
            raise ValueError(f"quant_min ({quant_min}) must be below quant_max ({quant_max})")
        if quant_min < lo_signed or quant_max > 2**self.num_bits - 1 or quant_max - quant_min > 2**self.num_bits - 1:
            raise ValueError(
                f"[{quant_min}, {quant_max}] does not fit in {self.num_bits} bits "
                f"(signed [{lo_signed}, {hi_signed}] or unsigned [0, {2**self.num_bits - 1}])"
            )
        if self.symmetric and not quant_min < 0 < quant_max:
            raise ValueError(f"a symmetric config needs quant_min < 0 < quant_max, got [{quant_min}, {quant_max}]")
        object.__setattr__(self, "quant_min", int(quant_min))
        object.__setattr__(self, "quant_max", int(quant_max))

    def _normalize_scale_offset(self) -> None:
        if self.scale is None:
            if self.offset is not None:
                raise ValueError("offset given without scale")
            if self.state in _STATES_WITH_SCALE:
                raise ValueError(f"state {self.state.value} requires a scale")
            return
        scale = np.array(self.scale, dtype=np.float32)  # copy: the caller's array stays theirs
        expected_ndim = 1 if self.per_channel else 0
        if scale.ndim != expected_ndim or scale.size == 0:
            kind = "a 1-D (C,) array" if self.per_channel else "a scalar"
            raise ValueError(f"scale must be {kind} for per_channel={self.per_channel}, got shape {scale.shape}")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise ValueError("scale must be finite and strictly positive")
        if self.offset is None:
            offset = np.zeros(scale.shape, dtype=np.int32)
        else:
            offset_in = np.asarray(self.offset)
            if not np.issubdtype(offset_in.dtype, np.integer):
                raise ValueError(f"offset must be integer, got dtype {offset_in.dtype}")
            offset = np.broadcast_to(offset_in, scale.shape).astype(np.int32)
        if self.symmetric and np.any(offset != 0):
            raise ValueError("a symmetric config has offset 0")
        if np.any(offset < self.quant_min) or np.any(offset > self.quant_max):
            raise ValueError(f"offset must lie in [{self.quant_min}, {self.quant_max}]")
        scale.setflags(write=False)
        offset.setflags(write=False)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "offset", offset)

    @property
    def is_quantized(self) -> bool:
        """True when this config inserts quantization (any state but FP32)."""
        return self.state is not QuantState.FP32

    def with_scale(
        self,
        scale: np.ndarray | float,
        offset: np.ndarray | int | None = None,
        *,
        state: QuantState = QuantState.ACTIVATED,
    ) -> TensorQuantConfig:
        """A copy carrying ``scale``/``offset`` in ``state`` (validated again)."""
        return replace(self, scale=scale, offset=offset, state=state)

    def with_state(self, state: QuantState) -> TensorQuantConfig:
        return replace(self, state=state)

    def same_quantization(self, other: TensorQuantConfig) -> bool:
        """True when both would quantize a tensor identically, ignoring state and calibrated values."""
        keys = (
            "num_bits",
            "symmetric",
            "per_channel",
            "channel_axis",
            "observer",
            "quant_min",
            "quant_max",
            "dominator",
        )
        return all(getattr(self, k) == getattr(other, k) for k in keys)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (scale/offset as a number per-tensor, a list per-channel)."""

        def plain(array: np.ndarray | None, kind: type) -> Any:
            if array is None:
                return None
            return kind(array) if array.ndim == 0 else [kind(v) for v in array]

        return {
            "bits": self.num_bits,
            "symmetric": self.symmetric,
            "per_channel": self.per_channel,
            "axis": self.channel_axis,
            "quant_min": self.quant_min,
            "quant_max": self.quant_max,
            "scale": plain(self.scale, float),
            "offset": plain(self.offset, int),
            "observer": self.observer,
            "state": self.state.value,
            "dominator": self.dominator,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorQuantConfig):
            return NotImplemented
        if not self.same_quantization(other) or self.state is not other.state:
            return False
        if (self.scale is None) != (other.scale is None):
            return False
        return self.scale is None or (
            np.array_equal(self.scale, other.scale) and np.array_equal(self.offset, other.offset)
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays; equality is by value
