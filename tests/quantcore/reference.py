"""Independent numpy reference of the quantization numerics (tests only; shares no code with quantcore).

Written from the formulas, by other means than the kernels:

* rounding: float64 arithmetic with ties detected explicitly (frac == 1/2) and resolved by a rule per
  mode, instead of torch's floor/where forms;
* linear: q = clip(round(x / s) + o, quant_min, quant_max), x̂ = (q - o) · s, with x / s divided in
  float32 (the precision ONNX QuantizeLinear uses) and everything after it in float64;
* FP8: a lookup in the table of every finite value of the format, built from the bit layout
  (sign, exponent field, mantissa field), instead of the kernels' frexp/step arithmetic.
"""

from __future__ import annotations

import numpy as np

MODES = ("half_even", "half_up", "half_down", "half_towards_zero", "half_away_from_zero", "ceil", "floor")


def round_reference(v: np.ndarray, mode: str) -> np.ndarray:
    """Integers nearest to ``v`` (float64) under ``mode``; ties are v - floor(v) == 1/2 exactly."""
    v = np.asarray(v, dtype=np.float64)
    if mode == "ceil":
        return np.ceil(v)
    if mode == "floor":
        return np.floor(v)
    low = np.floor(v)
    frac = v - low
    nearest = np.where(frac < 0.5, low, low + 1)
    tie_choice = {
        "half_even": np.where(np.mod(low, 2) == 0, low, low + 1),
        "half_up": low + 1,
        "half_down": low,
        "half_towards_zero": np.where(v > 0, low, low + 1),
        "half_away_from_zero": np.where(v > 0, low + 1, low),
    }[mode]
    return np.where(frac == 0.5, tie_choice, nearest)


def linear_reference(
    x: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    quant_min: int,
    quant_max: int,
    axis: int | None,
    mode: str = "half_even",
) -> tuple[np.ndarray, np.ndarray]:
    """(codes as float64, x̂ as float32) for linear quantization; scale/offset broadcast along ``axis``."""
    s = np.asarray(scale, dtype=np.float32)
    o = np.asarray(offset, dtype=np.float64)
    if axis is not None and s.ndim:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, o = s.reshape(shape), o.reshape(shape)
    v = (x.astype(np.float32) / s).astype(np.float64)  # float32 division, like QuantizeLinear
    q = np.clip(round_reference(v, mode) + o, quant_min, quant_max)
    return q, ((q - o) * s.astype(np.float64)).astype(np.float32)


def power_of_2_reference(scale: np.ndarray) -> np.ndarray:
    """2^⌈log2 s⌉ by search over exponents (not log2): the smallest power of two >= s."""
    s = np.asarray(scale, dtype=np.float64)
    exponents = np.arange(-140, 130, dtype=np.float64)
    powers = 2.0**exponents  # (E,)
    index = np.argmax(powers[None, :] >= s.reshape(-1, 1), axis=1)
    return powers[index].reshape(s.shape).astype(np.float32)


def scale_offset_reference(
    lo: float, hi: float, quant_min: float, quant_max: float, *, symmetric: bool, power_of_2: bool = False
) -> tuple[np.float32, int]:
    """Scale and offset of a range, per the formulas (scalar only, plain Python floats)."""
    if symmetric:
        amax = max(abs(lo), abs(hi))
        scale = amax / quant_max if amax > 0 else 1.0
    else:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        scale = (hi - lo) / (quant_max - quant_min) if hi > lo else 1.0
    scale = max(scale, 1e-30)
    if power_of_2:
        scale = float(power_of_2_reference(np.asarray(scale)))
    scale32 = np.float32(scale)
    if symmetric:
        return scale32, 0
    offset = round_reference(np.asarray(quant_min - lo / float(scale32)), "half_even")
    return scale32, int(np.clip(offset, quant_min, quant_max))


# ---- FP8 ---------------------------------------------------------------------------------------


def float_table(exponent_bits: int, mantissa_bits: int, *, finite_only_top: bool) -> tuple[np.ndarray, float]:
    """(sorted non-negative finite values of the format, value of the first code past the max).

    Codes are (exponent field E, mantissa field M): E = 0 subnormal M/2^m · 2^(1-bias), else
    (1 + M/2^m) · 2^(E-bias). ``finite_only_top`` (E4M3FN): the top exponent field holds finite values
    except its all-ones mantissa (NaN). Otherwise (E5M2, IEEE): the top exponent field is inf/NaN.
    """
    bias = 2 ** (exponent_bits - 1) - 1
    values = []
    for code in range(2 ** (exponent_bits + mantissa_bits)):
        e, m = code >> mantissa_bits, code & (2**mantissa_bits - 1)
        if e == 0:
            values.append(m / 2**mantissa_bits * 2.0 ** (1 - bias))
        else:
            values.append((1 + m / 2**mantissa_bits) * 2.0 ** (e - bias))
    top_field = 2**exponent_bits - 1
    finite_codes = 2 ** (exponent_bits + mantissa_bits) - 1 if finite_only_top else top_field << mantissa_bits
    return np.array(values[:finite_codes]), values[finite_codes]


def float_round_reference(
    v: np.ndarray,
    exponent_bits: int,
    mantissa_bits: int,
    *,
    finite_only_top: bool,
    mode: str = "half_even",
    quant_max: float | None = None,
    saturate: bool = True,
) -> np.ndarray:
    """``v`` rounded to the format by table lookup (float64). Ties go to the even code for half_even.

    Saturating: results beyond ±quant_max (default: the max) become ±quant_max, inf included.
    Otherwise a result that rounds past the max becomes NaN (E4M3FN) or ±inf (E5M2). NaN stays NaN.
    """
    positive, past_max = float_table(exponent_bits, mantissa_bits, finite_only_top=finite_only_top)
    codes = np.arange(len(positive) + 1)
    extended = np.append(positive, past_max)  # the point past the max, code len(positive)
    grid = np.concatenate([-extended[:0:-1], extended])  # sorted, -0 dropped
    grid_codes = np.concatenate([codes[:0:-1], codes])  # code of |value|, for the even rule
    v = np.asarray(v, dtype=np.float64)
    finite_v = np.where(np.isfinite(v), v, 0.0)
    upper_i = np.clip(np.searchsorted(grid, finite_v, side="left"), 1, len(grid) - 1)
    lower_i = upper_i - 1
    lower, upper = grid[lower_i], grid[upper_i]
    exact = upper == finite_v
    tie = (finite_v - lower) == (upper - finite_v)
    even_upper = grid_codes[upper_i] % 2 == 0
    tie_pick = {
        "half_even": np.where(even_upper, upper, lower),
        "half_up": upper,
        "half_down": lower,
        "half_towards_zero": np.where(finite_v > 0, lower, upper),
        "half_away_from_zero": np.where(finite_v > 0, upper, lower),
    }
    if mode == "ceil":
        out = np.where(exact, upper, upper)
    elif mode == "floor":
        out = np.where(exact, upper, lower)
    else:
        nearest = np.where(finite_v - lower < upper - finite_v, lower, upper)
        out = np.where(tie, tie_pick[mode], nearest)
    out = np.where(exact, finite_v, out)
    fmt_max = positive[-1]
    if saturate:
        limit = fmt_max if quant_max is None else quant_max
        out = np.where(np.isinf(v), np.sign(v) * limit, out)
        out = np.clip(out, -limit, limit)
    else:
        overflow = (np.abs(out) > fmt_max) | np.isinf(v)
        out = np.where(overflow, np.sign(v) * np.inf if not finite_only_top else np.nan, out)
    return np.where(np.isnan(v), np.nan, out)
