"""The vocabulary of a quantization scheme: ``QuantPolicy`` flags and ``RoundingPolicy`` modes.

A policy is one member of each pair, plus optional modifiers (the PPQ seed's QuantizationPolicy)::

    PER_TENSOR | PER_CHANNEL       one scale for the tensor, or one per slice along channel_axis
    LINEAR     | FLOATING          integer grid q·s, or a floating-point grid (FP8 E4M3FN / E5M2)·s
    SYMMETRIC  | ASYMMETRIC        offset 0, or an offset that maps the observed minimum onto quant_min
    POWER_OF_2                     scales rounded up to 2^k (shift-only hardware)
    DYNAMIC                        scale computed from each tensor value at run time, not calibrated

FLOATING is SYMMETRIC (a floating grid has no offset). Rounding of x/s to the grid follows one
``RoundingPolicy``; HALF_EVEN is what ONNX QuantizeLinear does and the default.
"""

from __future__ import annotations

import enum


class QuantPolicy(enum.Flag):
    PER_TENSOR = enum.auto()
    PER_CHANNEL = enum.auto()
    LINEAR = enum.auto()
    FLOATING = enum.auto()
    SYMMETRIC = enum.auto()
    ASYMMETRIC = enum.auto()
    POWER_OF_2 = enum.auto()
    DYNAMIC = enum.auto()


# Each pair: exactly one member must be set.
POLICY_PAIRS = (
    (QuantPolicy.PER_TENSOR, QuantPolicy.PER_CHANNEL),
    (QuantPolicy.LINEAR, QuantPolicy.FLOATING),
    (QuantPolicy.SYMMETRIC, QuantPolicy.ASYMMETRIC),
)


def validate_policy(policy: QuantPolicy) -> None:
    """Raise ValueError unless ``policy`` holds exactly one member of each pair and a coherent mix."""
    if not isinstance(policy, QuantPolicy):
        raise ValueError(f"policy must be a QuantPolicy, got {policy!r}")
    for first, second in POLICY_PAIRS:
        if bool(policy & first) == bool(policy & second):
            raise ValueError(f"policy must set exactly one of {first.name} and {second.name}, got {policy!r}")
    if policy & QuantPolicy.FLOATING and policy & QuantPolicy.ASYMMETRIC:
        raise ValueError("policy FLOATING is SYMMETRIC: a floating-point grid has no offset")


def make_policy(
    *,
    symmetric: bool = True,
    per_channel: bool = False,
    floating: bool = False,
    power_of_2: bool = False,
    dynamic: bool = False,
) -> QuantPolicy:
    """The policy for the given choices, e.g. ``make_policy(per_channel=True)`` =
    PER_CHANNEL | LINEAR | SYMMETRIC."""
    policy = QuantPolicy.PER_CHANNEL if per_channel else QuantPolicy.PER_TENSOR
    policy |= QuantPolicy.FLOATING if floating else QuantPolicy.LINEAR
    policy |= QuantPolicy.SYMMETRIC if symmetric else QuantPolicy.ASYMMETRIC
    if power_of_2:
        policy |= QuantPolicy.POWER_OF_2
    if dynamic:
        policy |= QuantPolicy.DYNAMIC
    validate_policy(policy)
    return policy


def policy_names(policy: QuantPolicy) -> list[str]:
    """Member names in declaration order (the JSON form): ["PER_TENSOR", "LINEAR", "SYMMETRIC"]."""
    return [member.name for member in QuantPolicy if member & policy]


def policy_from_names(names: list[str]) -> QuantPolicy:
    policy = QuantPolicy(0)
    for name in names:
        if name not in QuantPolicy.__members__:
            raise ValueError(f"unknown policy member {name!r}; choose from {list(QuantPolicy.__members__)}")
        policy |= QuantPolicy[name]
    validate_policy(policy)
    return policy


class RoundingPolicy(enum.Enum):
    """How a real value v = x / s becomes an integer (PPQ's RoundingPolicy; ties are |v - ⌊v⌋| = ½).

    HALF_EVEN: nearest, ties to even (ONNX QuantizeLinear, IEEE default)   2.5 → 2, 3.5 → 4, -2.5 → -2
    HALF_UP: nearest, ties towards +inf                                     2.5 → 3, -2.5 → -2
    HALF_DOWN: nearest, ties towards -inf                                   2.5 → 2, -2.5 → -3
    HALF_TOWARDS_ZERO: nearest, ties towards 0                              2.5 → 2, -2.5 → -2
    HALF_AWAY_FROM_ZERO: nearest, ties away from 0 (C ``round``)            2.5 → 3, -2.5 → -3
    CEIL: ⌈v⌉      FLOOR: ⌊v⌋
    """

    HALF_EVEN = "half_even"
    HALF_UP = "half_up"
    HALF_DOWN = "half_down"
    HALF_TOWARDS_ZERO = "half_towards_zero"
    HALF_AWAY_FROM_ZERO = "half_away_from_zero"
    CEIL = "ceil"
    FLOOR = "floor"
