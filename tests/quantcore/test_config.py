"""TensorQuantConfig and QuantizeConfig validate themselves."""

from __future__ import annotations

import numpy as np
import pytest

from quantcore.annotate.platforms import PLATFORMS
from quantcore.config import PLATFORM_NAMES, PLATFORM_PRECISIONS, AccuracyTarget, NodeOverride, QuantizeConfig
from quantcore.numerics.tqc import QuantState, TensorQuantConfig


def test_symmetric_int8_defaults() -> None:
    tqc = TensorQuantConfig()
    assert (tqc.quant_min, tqc.quant_max) == (-128, 127)
    assert tqc.state is QuantState.INITIAL and tqc.scale is None


def test_asymmetric_defaults_to_unsigned_range() -> None:
    tqc = TensorQuantConfig(symmetric=False)
    assert (tqc.quant_min, tqc.quant_max) == (0, 255)


def test_scale_is_stored_read_only_float32_with_zero_offset() -> None:
    source = np.array([0.5, 0.25])
    tqc = TensorQuantConfig(per_channel=True, channel_axis=0, scale=source, state=QuantState.ACTIVATED)
    assert tqc.scale.dtype == np.float32 and not tqc.scale.flags.writeable
    assert tqc.offset.tolist() == [0, 0]
    source[0] = 9.0  # the config holds its own copy
    assert tqc.scale[0] == np.float32(0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_bits": 17}, "num_bits"),
        ({"num_bits": 8.0}, "num_bits"),
        ({"per_channel": True}, "channel_axis"),
        ({"channel_axis": 0}, "channel_axis"),
        ({"observer": "kl-typo"}, "observer"),
        ({"quant_min": 5, "quant_max": 5}, "quant_min"),
        ({"quant_min": -200}, "does not fit"),
        ({"symmetric": True, "quant_min": 0, "quant_max": 255}, "symmetric"),
        ({"scale": 0.0, "state": QuantState.ACTIVATED}, "positive"),
        ({"scale": float("nan"), "state": QuantState.ACTIVATED}, "finite"),
        ({"scale": [0.1, 0.2]}, "scalar"),
        ({"scale": 0.1, "offset": 3}, "offset 0"),
        ({"state": QuantState.ACTIVATED}, "requires a scale"),
        ({"state": "activated"}, "QuantState"),
        ({"dominator": ""}, "dominator"),
    ],
)
def test_tensor_quant_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TensorQuantConfig(**kwargs)


def test_tensor_quant_config_equality_is_by_value() -> None:
    a = TensorQuantConfig(scale=0.5, state=QuantState.ACTIVATED)
    b = TensorQuantConfig(scale=np.float64(0.5), state=QuantState.ACTIVATED)
    assert a == b
    assert a != a.with_scale(0.25)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"platform": "tensorrt8"}, "platform"),
        ({"precision": "int4"}, "precision"),
        ({"observer": "kl-typo"}, "observer"),
        ({"percentile": 0.0}, "percentile"),
        ({"percentile": 100.5}, "percentile"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"exclude_op_types": "Conv"}, "exclude_op_types"),
        ({"exclude_node_patterns": ("",)}, "exclude_node_patterns"),
        ({"device": "gpu"}, "device"),
        ({"precision": "w4a4"}, "not available on platform 'tensorrt'"),
        ({"platform": "academic", "precision": "fp8"}, "not available on platform 'academic'"),
        ({"platform": "tensorrt-fp8", "precision": "int8"}, "not available on platform 'tensorrt-fp8'"),
        ({"platform": "academic", "precision": "w9a8"}, "precision"),
        ({"reduce_range": "yes"}, "reduce_range"),
        ({"overrides": NodeOverride("x", bits=4)}, "overrides"),
        ({"overrides": ("x",)}, "NodeOverride"),
        ({"platform": "tensorrt-fp8", "precision": "fp8", "overrides": (NodeOverride("x", bits=4),)}, "fp8"),
        ({"equalization": "yes"}, "equalization must be a bool"),
        ({"bias_correction": 1}, "bias_correction must be a bool"),
        ({"smoothquant": "yes"}, "smoothquant must be a bool"),
        ({"bias_correction": True, "target": AccuracyTarget("sqnr", 30.0)}, "bias_correction and target"),
    ],
)
def test_quantize_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuantizeConfig(**kwargs)


def test_quantize_config_normalises_lists_to_tuples() -> None:
    config = QuantizeConfig(exclude_op_types=["Gemm"], percentile=99)
    assert config.exclude_op_types == ("Gemm",) and config.percentile == 99.0


def test_platform_names_match_the_registry() -> None:
    """config names the platforms (it sits below their rule sets): each registered rule set is named
    there, under its own name, and has its accepted precisions listed."""
    assert set(PLATFORM_NAMES) == set(PLATFORMS) == set(PLATFORM_PRECISIONS)
    assert all(platform.name == name for name, platform in PLATFORMS.items())


def test_config_round_trips_to_a_report_dict() -> None:
    config = QuantizeConfig(
        platform="academic", precision="w4a8", overrides=[NodeOverride("fc", observer="mse")], reduce_range="off"
    )
    assert config.overrides == (NodeOverride("fc", observer="mse"),)  # lists become tuples
    assert config.precision_spec.weight_bits == 4 and config.precision_spec.activation_bits == 8
    assert config.to_dict()["overrides"] == [{"pattern": "fc", "bits": None, "observer": "mse"}]
