"""One tensor's quantization: `TensorQuantConfig` and its life-cycle `QuantState`.

Linear quantization of a tensor x with scale s and offset o (the seed's formula, also ONNX
QuantizeLinear/DequantizeLinear with round-half-to-even)::

    q = clip(round(x / s) + o, quant_min, quant_max)        x̂ = (q - o) · s

Floating (FP8): x̂ = s · fp8(clip(x / s, -quant_max, quant_max)) on the E4M3FN or E5M2 grid
(``quantcore.numerics.floating``). Per-channel: s and o are vectors of length C = x.shape[channel_axis],
broadcast along that axis. The scheme is a ``QuantPolicy`` (``quantcore.numerics.policy``); ``symmetric`` and
``per_channel`` are views of it, and constructor keywords that set that pair of the policy.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import numpy as np

from quantcore.checks import require_bool, require_int
from quantcore.numerics.floating import FloatFormat, float_format
from quantcore.numerics.policy import (
    QuantPolicy,
    RoundingPolicy,
    make_policy,
    policy_from_names,
    policy_names,
    validate_policy,
)

__all__ = ["OBSERVER_NAMES", "ObserverName", "QuantPolicy", "QuantState", "RoundingPolicy", "TensorQuantConfig"]

MIN_BITS, MAX_BITS = 2, 16

# The observers a TQC may name: the keys of ``quantcore.observers.registry.OBSERVERS`` (a test pins the two
# together). Named here rather than read from the registry because the observers build on TQCs.
ObserverName = Literal["minmax", "ema_minmax", "percentile", "kl", "mse", "floating", "constant"]
OBSERVER_NAMES: tuple[ObserverName, ...] = get_args(ObserverName)


class QuantState(enum.Enum):
    """Life cycle of one tensor's quantization (the PPQ seed's states).

    INITIAL: annotated, no scale yet.  ACTIVATED: scale/offset calibrated, quantization active.
    BAKED: a parameter already stored in quantized form (int8 initializer).  OVERLAPPED: another TQC
    on the same tensor takes precedence.  PASSIVE: scale derived from another tensor (``dominator``).
    FP32: deliberately left in float.

    Allowed moves (``TRANSITIONS``; staying in the same state is always allowed)::

        INITIAL    → ACTIVATED, PASSIVE, OVERLAPPED, FP32
        ACTIVATED  → BAKED, PASSIVE, OVERLAPPED, FP32, INITIAL (recalibrate)
        PASSIVE    → BAKED, ACTIVATED, OVERLAPPED, FP32, INITIAL
        OVERLAPPED → FP32, INITIAL
        FP32       → INITIAL (quantize again)
        BAKED      → (final: the float values are gone)
    """

    INITIAL = "initial"
    ACTIVATED = "activated"
    BAKED = "baked"
    OVERLAPPED = "overlapped"
    PASSIVE = "passive"
    FP32 = "fp32"


TRANSITIONS: dict[QuantState, frozenset[QuantState]] = {
    QuantState.INITIAL: frozenset({QuantState.ACTIVATED, QuantState.PASSIVE, QuantState.OVERLAPPED, QuantState.FP32}),
    QuantState.ACTIVATED: frozenset(
        {QuantState.BAKED, QuantState.PASSIVE, QuantState.OVERLAPPED, QuantState.FP32, QuantState.INITIAL}
    ),
    QuantState.PASSIVE: frozenset(
        {QuantState.BAKED, QuantState.ACTIVATED, QuantState.OVERLAPPED, QuantState.FP32, QuantState.INITIAL}
    ),
    QuantState.OVERLAPPED: frozenset({QuantState.FP32, QuantState.INITIAL}),
    QuantState.FP32: frozenset({QuantState.INITIAL}),
    QuantState.BAKED: frozenset(),
}

_STATES_WITH_SCALE = frozenset({QuantState.ACTIVATED, QuantState.BAKED, QuantState.PASSIVE, QuantState.OVERLAPPED})
_PAIR_KEYWORDS = {
    "symmetric": (QuantPolicy.SYMMETRIC, QuantPolicy.ASYMMETRIC),
    "per_channel": (QuantPolicy.PER_CHANNEL, QuantPolicy.PER_TENSOR),
}


def _signed_range(num_bits: int) -> tuple[int, int]:
    return -(2 ** (num_bits - 1)), 2 ** (num_bits - 1) - 1


@dataclass(frozen=True, eq=False, init=False)
class TensorQuantConfig:
    """How one tensor is quantized.

    ``policy`` (default PER_TENSOR | LINEAR | SYMMETRIC); the keywords ``symmetric=`` and
    ``per_channel=``, when given, set that pair of the policy (they win over ``policy``, which is what
    ``dataclasses.replace(tqc, symmetric=False)`` needs). ``rounding`` of x/s: half-even by default.

    Linear: ``num_bits`` 2-16. Symmetric configs are signed with offset 0 and by default quant range
    [-2^(b-1), 2^(b-1)-1] (int8: [-128, 127], what ONNX QuantizeLinear saturates to); asymmetric ones
    default to unsigned [0, 2^b - 1]. A narrower ``quant_min``/``quant_max`` is allowed
    (TensorRT's [-127, 127]; 3-bit values stored in int4/int8, see ``quantcore.numerics.storage_type``).

    Floating: ``num_bits`` 8 with ``exponent_bits`` 4 (E4M3FN, the default) or 5 (E5M2); mantissa
    bits = num_bits - 1 - exponent_bits. ``quant_max`` defaults to the format's max (448, 57344) and
    may be lowered to another grid point; ``quant_min`` = -quant_max. Both are floats.

    ``scale`` is stored as a read-only float32 array, shape () per-tensor or (C,) per-channel;
    ``offset`` as a read-only int32 array of the same shape. ``dominator`` names the tensor whose
    scale this one shares (resolved during calibration; state becomes PASSIVE). ``constant_range``
    (lo, hi) is the range the ``constant`` observer reports, required with that observer only.
    DYNAMIC configs compute their scale from each value at run time: no scale is required.
    POWER_OF_2 configs hold power-of-two scales only (``scale_offset`` produces them).

    ``replace()`` carries quant_min/quant_max over; pass ``quant_min=None, quant_max=None`` with a
    new ``num_bits`` or policy to get the new defaults.
    """

    num_bits: int
    channel_axis: int | None
    observer: ObserverName
    quant_min: int | float
    quant_max: int | float
    scale: np.ndarray | None
    offset: np.ndarray | None
    state: QuantState
    dominator: str | None
    policy: QuantPolicy
    rounding: RoundingPolicy
    exponent_bits: int | None
    constant_range: tuple[float, float] | None = field(default=None)

    def __init__(
        self,
        num_bits: int = 8,
        symmetric: bool | None = None,
        per_channel: bool | None = None,
        channel_axis: int | None = None,
        observer: ObserverName = "minmax",
        quant_min: int | float | None = None,
        quant_max: int | float | None = None,
        scale: np.ndarray | float | None = None,
        offset: np.ndarray | int | None = None,
        state: QuantState = QuantState.INITIAL,
        dominator: str | None = None,
        *,
        policy: QuantPolicy | None = None,
        rounding: RoundingPolicy = RoundingPolicy.HALF_EVEN,
        exponent_bits: int | None = None,
        constant_range: tuple[float, float] | None = None,
    ) -> None:
        values = {
            "num_bits": num_bits,
            "channel_axis": channel_axis,
            "observer": observer,
            "quant_min": quant_min,
            "quant_max": quant_max,
            "scale": scale,
            "offset": offset,
            "state": state,
            "dominator": dominator,
            "policy": self._resolve_policy(policy, symmetric=symmetric, per_channel=per_channel),
            "rounding": rounding,
            "exponent_bits": exponent_bits,
            "constant_range": constant_range,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._validate()

    @staticmethod
    def _resolve_policy(policy: QuantPolicy | None, **pairs: bool | None) -> QuantPolicy:
        if policy is None:
            policy = make_policy()
        validate_policy(policy)
        for keyword, value in pairs.items():
            if value is None:
                continue
            require_bool(keyword, value)
            yes, no = _PAIR_KEYWORDS[keyword]
            policy = (policy & ~(yes | no)) | (yes if value else no)
        validate_policy(policy)
        return policy

    # ---- views of the policy -------------------------------------------------------------------
    @property
    def symmetric(self) -> bool:
        return bool(self.policy & QuantPolicy.SYMMETRIC)

    @property
    def per_channel(self) -> bool:
        return bool(self.policy & QuantPolicy.PER_CHANNEL)

    @property
    def floating(self) -> bool:
        return bool(self.policy & QuantPolicy.FLOATING)

    @property
    def power_of_2(self) -> bool:
        return bool(self.policy & QuantPolicy.POWER_OF_2)

    @property
    def dynamic(self) -> bool:
        return bool(self.policy & QuantPolicy.DYNAMIC)

    @property
    def mantissa_bits(self) -> int | None:
        return None if self.exponent_bits is None else self.num_bits - 1 - self.exponent_bits

    @property
    def float_format(self) -> FloatFormat:
        """The floating grid (E4M3FN or E5M2); ValueError for a linear config."""
        if not self.floating or self.exponent_bits is None:
            raise ValueError("float_format is defined for FLOATING configs only")
        return float_format(self.exponent_bits, self.num_bits - 1 - self.exponent_bits)

    @property
    def is_quantized(self) -> bool:
        """True when this config inserts quantization (any state but FP32)."""
        return self.state is not QuantState.FP32

    # ---- validation ----------------------------------------------------------------------------
    def _validate(self) -> None:
        require_int("num_bits", self.num_bits)
        if not MIN_BITS <= self.num_bits <= MAX_BITS:
            raise ValueError(f"num_bits must be in [{MIN_BITS}, {MAX_BITS}], got {self.num_bits}")
        if self.per_channel:
            require_int("channel_axis", self.channel_axis)
        elif self.channel_axis is not None:
            raise ValueError("channel_axis must be None when per_channel is False")
        if self.observer not in OBSERVER_NAMES:
            raise ValueError(f"observer must be one of {sorted(OBSERVER_NAMES)}, got {self.observer!r}")
        if not isinstance(self.rounding, RoundingPolicy):
            raise ValueError(f"rounding must be a RoundingPolicy, got {self.rounding!r}")
        if not isinstance(self.state, QuantState):
            raise ValueError(f"state must be a QuantState, got {self.state!r}")
        if self.dominator is not None and (not isinstance(self.dominator, str) or not self.dominator):
            raise ValueError(f"dominator must be a non-empty tensor name or None, got {self.dominator!r}")
        self._validate_constant_range()
        if self.floating:
            self._validate_floating()
        else:
            if self.exponent_bits is not None:
                raise ValueError("exponent_bits is for FLOATING configs; a LINEAR config has none")
            self._validate_range()
        self._normalize_scale_offset()

    def _validate_constant_range(self) -> None:
        if (self.observer == "constant") != (self.constant_range is not None):
            raise ValueError("constant_range (lo, hi) is required with observer 'constant' and only with it")
        if self.constant_range is None:
            return
        try:
            lo, hi = (float(v) for v in self.constant_range)
        except (TypeError, ValueError):
            raise ValueError(f"constant_range must be (lo, hi) numbers, got {self.constant_range!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"constant_range must be finite with lo <= hi, got {self.constant_range!r}")
        object.__setattr__(self, "constant_range", (lo, hi))

    def _validate_floating(self) -> None:
        exponent_bits = 4 if self.exponent_bits is None else self.exponent_bits
        require_int("exponent_bits", exponent_bits)
        if not 1 <= exponent_bits <= self.num_bits - 2:
            raise ValueError(f"exponent_bits must leave a sign and a mantissa bit, got {exponent_bits}")
        object.__setattr__(self, "exponent_bits", int(exponent_bits))
        fmt = self.float_format
        quant_max = fmt.max if self.quant_max is None else self.quant_max
        if isinstance(quant_max, bool) or not isinstance(quant_max, (int, float, np.integer, np.floating)):
            raise ValueError(f"quant_max must be a number, got {quant_max!r}")
        quant_max = float(quant_max)
        if not (0 < quant_max <= fmt.max and fmt.representable(quant_max)):
            raise ValueError(f"quant_max must be a positive {fmt.name} value <= {fmt.max}, got {quant_max}")
        quant_min = -quant_max if self.quant_min is None else float(self.quant_min)
        if quant_min != -quant_max:
            raise ValueError(f"a floating config saturates symmetrically: quant_min must be {-quant_max}")
        object.__setattr__(self, "quant_min", quant_min)
        object.__setattr__(self, "quant_max", quant_max)

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
            if self.state in _STATES_WITH_SCALE and not self.dynamic:
                raise ValueError(f"state {self.state.value} requires a scale")
            return
        scale = np.array(self.scale, dtype=np.float32)  # copy: the caller's array stays theirs
        expected_ndim = 1 if self.per_channel else 0
        if scale.ndim != expected_ndim or scale.size == 0:
            kind = "a 1-D (C,) array" if self.per_channel else "a scalar"
            raise ValueError(f"scale must be {kind} for per_channel={self.per_channel}, got shape {scale.shape}")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise ValueError("scale must be finite and strictly positive")
        if self.power_of_2 and not np.all(np.frexp(scale)[0] == 0.5):
            raise ValueError(f"a POWER_OF_2 config needs power-of-two scales, got {scale}")
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

    # ---- state machine -------------------------------------------------------------------------
    def transition(
        self,
        state: QuantState,
        *,
        scale: np.ndarray | float | None = None,
        offset: np.ndarray | int | None = None,
    ) -> TensorQuantConfig:
        """A copy in ``state`` (optionally with a new scale/offset); ValueError for a move that
        ``TRANSITIONS`` does not allow. Moving to INITIAL or FP32 drops scale and offset."""
        if not isinstance(state, QuantState):
            raise ValueError(f"state must be a QuantState, got {state!r}")
        if state is not self.state and state not in TRANSITIONS[self.state]:
            allowed = sorted(s.value for s in TRANSITIONS[self.state]) or ["none: final"]
            raise ValueError(f"illegal transition {self.state.value} → {state.value}; allowed: {allowed}")
        if state in (QuantState.INITIAL, QuantState.FP32):
            return replace(self, state=state, scale=None, offset=None)
        if scale is None:
            return replace(self, state=state)
        return replace(self, state=state, scale=scale, offset=offset)

    def with_scale(
        self,
        scale: np.ndarray | float,
        offset: np.ndarray | int | None = None,
        *,
        state: QuantState = QuantState.ACTIVATED,
    ) -> TensorQuantConfig:
        """A copy carrying ``scale``/``offset`` in ``state`` (a checked transition, validated again)."""
        return self.transition(state, scale=scale, offset=offset)

    def with_state(self, state: QuantState) -> TensorQuantConfig:
        """A copy in ``state`` (a checked transition; scale kept unless the state drops it)."""
        return self.transition(state)

    # ---- comparison and serialisation ---------------------------------------------------------
    def same_quantization(self, other: TensorQuantConfig) -> bool:
        """True when both would quantize a tensor identically, ignoring state and calibrated values."""
        keys = (
            "num_bits",
            "policy",
            "rounding",
            "exponent_bits",
            "channel_axis",
            "observer",
            "quant_min",
            "quant_max",
            "dominator",
            "constant_range",
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
            "policy": policy_names(self.policy),
            "rounding": self.rounding.value,
            "exponent_bits": self.exponent_bits,
            "constant_range": None if self.constant_range is None else list(self.constant_range),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorQuantConfig:
        """Inverse of ``to_dict`` (``to_dict(from_dict(d)) == d`` for a ``d`` that ``to_dict`` wrote)."""
        constant_range = data.get("constant_range")
        return cls(
            num_bits=data["bits"],
            channel_axis=data["axis"],
            observer=data["observer"],
            quant_min=data["quant_min"],
            quant_max=data["quant_max"],
            scale=data["scale"],
            offset=data["offset"],
            state=QuantState(data["state"]),
            dominator=data["dominator"],
            policy=policy_from_names(data["policy"]),
            rounding=RoundingPolicy(data["rounding"]),
            exponent_bits=data["exponent_bits"],
            constant_range=None if constant_range is None else tuple(constant_range),
        )

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
