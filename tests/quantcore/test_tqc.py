"""TensorQuantConfig: policies, rounding, bit widths, the state machine, storage types, scale/offset."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.errors import UnsupportedModelError
from quantcore.numerics.policy import QuantPolicy, RoundingPolicy, make_policy
from quantcore.numerics.scaling import scale_offset
from quantcore.numerics.storage_type import storage_type
from quantcore.numerics.tqc import TRANSITIONS, QuantState, TensorQuantConfig
from tests.quantcore.reference import scale_offset_reference

P = QuantPolicy
FP8 = P.PER_TENSOR | P.FLOATING | P.SYMMETRIC


def test_existing_keywords_map_onto_the_policy() -> None:
    tqc = TensorQuantConfig(num_bits=8, symmetric=True, per_channel=True, channel_axis=0, observer="minmax")
    assert tqc.policy == P.PER_CHANNEL | P.LINEAR | P.SYMMETRIC
    assert tqc.symmetric and tqc.per_channel and not tqc.floating
    assert TensorQuantConfig(symmetric=False).policy == P.PER_TENSOR | P.LINEAR | P.ASYMMETRIC


def test_replace_with_a_pair_keyword_or_a_policy() -> None:
    tqc = TensorQuantConfig(per_channel=True, channel_axis=1)
    per_tensor = replace(tqc, per_channel=False, channel_axis=None)
    assert per_tensor.policy == P.PER_TENSOR | P.LINEAR | P.SYMMETRIC
    asymmetric = replace(tqc, policy=P.PER_CHANNEL | P.LINEAR | P.ASYMMETRIC, quant_min=None, quant_max=None)
    assert not asymmetric.symmetric and (asymmetric.quant_min, asymmetric.quant_max) == (0, 255)
    assert replace(tqc, num_bits=4, quant_min=None, quant_max=None).quant_min == -8


@pytest.mark.parametrize(
    "policy",
    [
        P.LINEAR | P.SYMMETRIC,  # no granularity
        P.PER_TENSOR | P.PER_CHANNEL | P.LINEAR | P.SYMMETRIC,
        P.PER_TENSOR | P.LINEAR | P.FLOATING | P.SYMMETRIC,
        P.PER_TENSOR | P.LINEAR,
        P.PER_TENSOR | P.LINEAR | P.SYMMETRIC | P.ASYMMETRIC,
        P.PER_TENSOR | P.FLOATING | P.ASYMMETRIC,  # a floating grid has no offset
    ],
)
def test_invalid_policies_are_refused(policy: QuantPolicy) -> None:
    with pytest.raises(ValueError, match="policy"):
        TensorQuantConfig(policy=policy)


@pytest.mark.parametrize("num_bits", range(2, 17))
@pytest.mark.parametrize("symmetric", [True, False])
def test_every_width_from_2_to_16_has_its_default_range(num_bits: int, symmetric: bool) -> None:
    tqc = TensorQuantConfig(num_bits=num_bits, symmetric=symmetric)
    expected = (-(2 ** (num_bits - 1)), 2 ** (num_bits - 1) - 1) if symmetric else (0, 2**num_bits - 1)
    assert (tqc.quant_min, tqc.quant_max) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_bits": 1}, "num_bits"),
        ({"num_bits": 17}, "num_bits"),
        ({"rounding": "half_even"}, "rounding"),
        ({"exponent_bits": 4}, "exponent_bits"),  # linear config
        ({"policy": FP8, "exponent_bits": 3}, "E3M4"),  # no such registered format
        ({"policy": FP8, "quant_max": 449.0}, "quant_max"),
        ({"policy": FP8, "quant_max": 300.0}, "quant_max"),  # not an E4M3FN value
        ({"policy": FP8, "quant_min": -240.0, "quant_max": 448.0}, "quant_min"),
        ({"observer": "constant"}, "constant_range"),
        ({"constant_range": (0.0, 1.0)}, "constant_range"),
        ({"observer": "constant", "constant_range": (2.0, 1.0)}, "constant_range"),
        ({"symmetric": 1}, "symmetric"),
        ({"policy": make_policy(power_of_2=True), "scale": 0.3}, "power-of-two"),
    ],
)
def test_invalid_configs_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TensorQuantConfig(**kwargs)


def test_floating_defaults_and_formats() -> None:
    e4m3 = TensorQuantConfig(policy=FP8)
    assert (e4m3.exponent_bits, e4m3.mantissa_bits, e4m3.quant_min, e4m3.quant_max) == (4, 3, -448.0, 448.0)
    e5m2 = TensorQuantConfig(policy=FP8, exponent_bits=5)
    assert e5m2.float_format.name == "float8e5m2" and e5m2.quant_max == 57344.0
    assert TensorQuantConfig(policy=FP8, quant_max=240.0).quant_min == -240.0  # a lowered saturation point


def test_dynamic_configs_need_no_scale() -> None:
    tqc = TensorQuantConfig(policy=P.PER_TENSOR | P.LINEAR | P.ASYMMETRIC | P.DYNAMIC, state=QuantState.ACTIVATED)
    assert tqc.dynamic and tqc.scale is None


def test_transitions_follow_the_table() -> None:
    initial = TensorQuantConfig()
    active = initial.transition(QuantState.ACTIVATED, scale=0.5)
    assert active.state is QuantState.ACTIVATED and active.scale == np.float32(0.5)
    baked = active.transition(QuantState.BAKED)
    assert baked.scale == active.scale
    with pytest.raises(ValueError, match="illegal transition baked"):
        baked.transition(QuantState.ACTIVATED)
    with pytest.raises(ValueError, match="illegal transition initial → baked"):
        initial.transition(QuantState.BAKED)
    assert active.transition(QuantState.FP32).scale is None  # leaving quantization drops the scale
    assert active.with_state(QuantState.BAKED) == baked
    assert initial.with_scale(0.25, state=QuantState.PASSIVE).state is QuantState.PASSIVE
    for state, allowed in TRANSITIONS.items():  # every state lists only real states, never itself
        assert state not in allowed


def test_round_trip_through_json_form() -> None:
    tqc = TensorQuantConfig(
        num_bits=4,
        policy=P.PER_CHANNEL | P.LINEAR | P.ASYMMETRIC | P.POWER_OF_2,
        channel_axis=1,
        rounding=RoundingPolicy.HALF_AWAY_FROM_ZERO,
        scale=[0.5, 0.25],
        offset=[3, 7],
        state=QuantState.ACTIVATED,
        dominator="x",
    )
    assert TensorQuantConfig.from_dict(tqc.to_dict()) == tqc
    assert tqc.to_dict()["policy"] == ["PER_CHANNEL", "LINEAR", "ASYMMETRIC", "POWER_OF_2"]


@pytest.mark.parametrize(
    ("kwargs", "name", "opset", "onnx_type"),
    [
        ({}, "int8", 10, onnx.TensorProto.INT8),
        ({"per_channel": True, "channel_axis": 0}, "int8", 13, onnx.TensorProto.INT8),
        ({"symmetric": False}, "uint8", 10, onnx.TensorProto.UINT8),
        ({"num_bits": 4}, "int4", 21, onnx.TensorProto.INT4),
        ({"num_bits": 4, "symmetric": False}, "uint4", 21, onnx.TensorProto.UINT4),
        ({"num_bits": 16}, "int16", 21, onnx.TensorProto.INT16),
        ({"num_bits": 16, "symmetric": False}, "uint16", 21, onnx.TensorProto.UINT16),
        ({"policy": FP8}, "float8e4m3fn", 19, onnx.TensorProto.FLOAT8E4M3FN),
        ({"policy": FP8, "exponent_bits": 5}, "float8e5m2", 19, onnx.TensorProto.FLOAT8E5M2),
    ],
)
def test_storage_types(kwargs: dict, name: str, opset: int, onnx_type: int) -> None:
    storage = storage_type(TensorQuantConfig(**kwargs))
    assert (storage.name, storage.min_opset, storage.onnx_type) == (name, opset, onnx_type)


def test_widths_onnx_cannot_store_need_an_explicit_widening() -> None:
    three_bit = TensorQuantConfig(num_bits=3)
    with pytest.raises(UnsupportedModelError, match=r"no 3-bit integer type.*widen=True"):
        storage_type(three_bit)
    assert storage_type(three_bit, widen=True).name == "int4"
    assert storage_type(three_bit, widen=True, allow_int4=False).name == "int8"
    assert (three_bit.quant_min, three_bit.quant_max) == (-4, 3)  # the restricted range travels with the config
    assert storage_type(TensorQuantConfig(num_bits=6, symmetric=False), widen=True).name == "uint8"
    assert storage_type(TensorQuantConfig(num_bits=12), widen=True).name == "int16"


ranges = st.tuples(st.floats(-1e4, 1e4, allow_subnormal=False), st.floats(-1e4, 1e4, allow_subnormal=False)).map(sorted)


@settings(max_examples=300, deadline=None)
@given(
    bounds=ranges,
    num_bits=st.integers(2, 16),
    symmetric=st.booleans(),
    power_of_2=st.booleans(),
)
def test_scale_offset_matches_the_formulas(
    bounds: list[float], num_bits: int, symmetric: bool, power_of_2: bool
) -> None:
    lo, hi = bounds
    tqc = TensorQuantConfig(num_bits=num_bits, policy=make_policy(symmetric=symmetric, power_of_2=power_of_2))
    scale, offset = scale_offset(tqc, np.asarray(lo), np.asarray(hi))
    expected_scale, expected_offset = scale_offset_reference(
        lo, hi, tqc.quant_min, tqc.quant_max, symmetric=symmetric, power_of_2=power_of_2
    )
    # float64 maths rounded once to float32 in both: equal up to that one rounding (1 ulp)
    np.testing.assert_allclose(scale, expected_scale, rtol=1.2e-7, atol=0)
    if power_of_2:
        assert np.log2(float(scale)).is_integer()
    assert abs(int(offset) - expected_offset) <= (0 if scale == expected_scale else 1)
    # the range's ends land within half a step of the grid's ends (nothing is clipped away)
    if not symmetric and hi > lo and hi > 0 > lo:
        assert (tqc.quant_min - offset) * float(scale) <= min(lo, 0.0) + float(scale) / 2 + 1e-9


def test_floating_scale_is_amax_over_the_format_max() -> None:
    scale, offset = scale_offset(TensorQuantConfig(policy=FP8), np.asarray(-3.0), np.asarray(896.0))
    assert scale == np.float32(2.0) and offset == 0
    pow2, _ = scale_offset(TensorQuantConfig(policy=FP8 | P.POWER_OF_2), np.asarray(0.0), np.asarray(900.0))
    assert pow2 == np.float32(4.0)  # 900 / 448 = 2.009 → rounded up to 4


def test_configs_survive_pickle_and_deepcopy() -> None:
    import copy
    import pickle

    tqc = TensorQuantConfig(policy=FP8, exponent_bits=5, scale=2.0, state=QuantState.ACTIVATED, dominator="a")
    assert pickle.loads(pickle.dumps(tqc)) == tqc
    assert copy.deepcopy(tqc) == tqc
