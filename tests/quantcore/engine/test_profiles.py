"""profiles: explicit profiles are checked against the model; derived ones follow the calibration shapes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from quantcore.errors import InvalidDataError
from quantcore.runtime.batching import input_specs
from quantcore.tensorrt.profiles import (
    OptimizationProfile,
    ShapeRange,
    derive_range,
    dynamic_inputs,
    observed_shapes,
    profiles_for,
)
from samples.tiny import stateful_data, stateful_model
from tests.quantcore.models import conv_bn_residual


def two_input_model():
    """tokens (N, seq) int64 and mask (N, seq) float → Identity outputs; image (1, 3, 8, 8) fixed."""
    inputs = [
        helper.make_tensor_value_info("tokens", TensorProto.INT64, ["N", "seq"]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", "seq"]),
        helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8]),
    ]
    outputs = [
        helper.make_tensor_value_info(n, t, None)
        for n, t in (("a", TensorProto.INT64), ("b", TensorProto.FLOAT), ("c", TensorProto.FLOAT))
    ]
    nodes = [helper.make_node("Identity", [i], [o]) for i, o in (("tokens", "a"), ("mask", "b"), ("image", "c"))]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_shape_range_validates() -> None:
    assert ShapeRange([1, 3], (2, 3), (4, 3)).opt == (2, 3)
    with pytest.raises(ValueError, match="min <= opt <= max"):
        ShapeRange((4, 3), (2, 3), (8, 3))
    with pytest.raises(ValueError, match="one rank"):
        ShapeRange((1,), (1, 3), (1, 3))
    with pytest.raises(ValueError, match=">= 1"):
        ShapeRange((0, 3), (1, 3), (1, 3))
    with pytest.raises(ValueError, match="twice"):
        OptimizationProfile((("x", ShapeRange((1,), (1,), (1,))), ("x", ShapeRange((1,), (1,), (1,)))))


def test_dynamic_inputs_ignore_fixed_ones() -> None:
    assert dynamic_inputs(two_input_model()) == {"tokens": ("N", "seq"), "mask": ("N", "seq")}


def test_observed_shapes_are_the_fed_batches() -> None:
    data = {"input": np.zeros((40, 3, 8, 8), np.float32)}
    specs = input_specs(conv_bn_residual())
    assert observed_shapes(data, 16, specs) == {"input": [(16, 3, 8, 8), (8, 3, 8, 8)]}
    assert observed_shapes(data, 40, specs) == {"input": [(40, 3, 8, 8)]}


def test_observed_shapes_batch_each_input_along_its_own_axis() -> None:
    specs = input_specs(stateful_model(state_size=16))
    shapes = observed_shapes(stateful_data(40, seed=0, state_size=16), 16, specs)
    # state (2, B, 16) batches along axis 1; the scalar sr is fed whole with every batch
    assert shapes == {"x": [(16, 16), (8, 16)], "state": [(2, 16, 16), (2, 8, 16)], "sr": [()]}


def test_profiles_widen_the_batch_axis_where_it_is() -> None:
    model = stateful_model(state_size=16)
    shapes = observed_shapes(stateful_data(40, seed=0, state_size=16), 16, input_specs(model))
    (profile,) = profiles_for(model, calibration_shapes=shapes, batch_sizes=(1, 32))
    assert profile.to_dict() == {  # sr is a scalar: nothing to bound, so no entry
        "state": {"min": [2, 1, 16], "opt": [2, 16, 16], "max": [2, 32, 16]},
        "x": {"min": [1, 16], "opt": [16, 16], "max": [32, 16]},
    }


def test_derive_min_typical_max() -> None:
    seen = [(16, 128), (16, 128), (16, 64), (3, 200)]
    shape = derive_range(seen)
    assert shape == ShapeRange((3, 64), (16, 128), (16, 200))  # opt: the most frequent shape
    widened = derive_range(seen, batch_sizes=(1, 32))
    assert widened == ShapeRange((1, 64), (16, 128), (32, 200))  # batch axis covers deployment batches
    second = derive_range([(128, 16), (64, 3)], batch_sizes=(1, 32), batch_axis=1)
    assert second == ShapeRange((64, 1), (128, 16), (128, 32))  # ties: the larger volume is opt


def test_profiles_derived_from_calibration_data() -> None:
    model = conv_bn_residual()
    shapes = observed_shapes({"input": np.zeros((40, 3, 8, 8), np.float32)}, 16, input_specs(model))
    (profile,) = profiles_for(model, calibration_shapes=shapes, batch_sizes=(1, 32))
    assert profile.to_dict() == {"input": {"min": [1, 3, 8, 8], "opt": [16, 3, 8, 8], "max": [32, 3, 8, 8]}}


def test_profiles_need_shapes_for_every_dynamic_input() -> None:
    model = two_input_model()
    with pytest.raises(InvalidDataError, match="mask"):
        profiles_for(model, calibration_shapes={"tokens": [(4, 10)]})
    (profile,) = profiles_for(model, calibration_shapes={"tokens": [(4, 10), (4, 12)], "mask": [(4, 10), (4, 12)]})
    assert profile.names == ("mask", "tokens")
    assert profile["tokens"] == ShapeRange((4, 10), (4, 12), (4, 12))


def test_explicit_profiles_are_checked_against_the_model() -> None:
    model = conv_bn_residual()
    good = OptimizationProfile.of({"input": ShapeRange((1, 3, 8, 8), (8, 3, 8, 8), (64, 3, 8, 8))})
    assert profiles_for(model, explicit=[good]) == (good,)
    wrong_fixed = OptimizationProfile.of({"input": ShapeRange((1, 3, 8, 8), (8, 3, 16, 16), (64, 3, 16, 16))})
    with pytest.raises(InvalidDataError, match="axis 2"):
        profiles_for(model, explicit=[wrong_fixed])
    wrong_rank = OptimizationProfile.of({"input": ShapeRange((1, 3), (1, 3), (1, 3))})
    with pytest.raises(InvalidDataError, match="rank"):
        profiles_for(model, explicit=[wrong_rank])
    other = OptimizationProfile.of({"other": ShapeRange((1,), (1,), (1,))})
    with pytest.raises(InvalidDataError, match="input"):
        profiles_for(model, explicit=[other])


def test_static_model_needs_no_profile() -> None:
    model = conv_bn_residual()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    assert profiles_for(model) == ()
