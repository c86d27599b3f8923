"""calibrate: scales from streamed activations, weights, shared scales, progress."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantcore import InvalidDataError, QuantizeConfig, QuantState, annotate, calibrate, prepare
from tests.quantcore.models import conv_bn_residual


def fp32_tensors(model: onnx.ModelProto, names: list[str], x: np.ndarray) -> dict[str, np.ndarray]:
    """Intermediate FP32 tensors, computed independently of quantcore's calibration runner."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, {"input": x}), strict=True))


@pytest.fixture
def setup():
    prepared = prepare(conv_bn_residual(seed=2))
    x = np.random.default_rng(0).normal(size=(30, 3, 8, 8)).astype(np.float32)
    return prepared, x


def test_minmax_scales_are_amax_over_127(setup) -> None:
    prepared, x = setup
    config = QuantizeConfig(observer="minmax", batch_size=7)  # 30 samples: batches of 7,7,7,7,2
    calibrated = calibrate(prepared, annotate(prepared, config), {"input": x}, config)
    values = fp32_tensors(prepared.model, ["r1", "flat"], x)
    values["input"] = x
    for name, value in values.items():
        tqc = calibrated.configs[name]
        assert tqc.state is QuantState.ACTIVATED
        # float32 scale of a float32 max: equal to 1 ulp
        assert tqc.scale == pytest.approx(np.abs(value).max() / 127, rel=1e-6), name
    weights = {t.name: numpy_helper.to_array(t) for t in prepared.model.graph.initializer}
    conv2 = calibrated.configs["conv2.w"]
    np.testing.assert_allclose(conv2.scale, np.abs(weights["conv2.w"]).reshape(4, -1).max(axis=1) / 127, rtol=1e-6)


def test_percentile_scale_does_not_exceed_minmax(setup) -> None:
    prepared, x = setup
    scales = {}
    for observer in ("minmax", "percentile"):
        config = QuantizeConfig(observer=observer, percentile=99.0)
        scales[observer] = calibrate(prepared, annotate(prepared, config), {"input": x}, config).configs
    for name in ("input", "r1", "flat"):
        assert scales["percentile"][name].scale < scales["minmax"][name].scale, name  # clips the 1% tail
    assert scales["percentile"]["conv1.w"] == scales["minmax"]["conv1.w"]  # weights always use minmax


def test_dominator_shares_one_scale(setup) -> None:
    prepared, x = setup
    # conv2 kept float: the Add has no int8 layer to fuse into and its sum is read by fc, so TensorRT's
    # rule quantizes both of its inputs, r1 and b2
    config = QuantizeConfig(observer="minmax", exclude_node_patterns=("conv2",))
    annotation = annotate(prepared, config)
    configs = dict(annotation.configs)
    configs["b2"] = replace(configs["b2"], dominator="r1")  # the Add's inputs share one scale
    calibrated = calibrate(prepared, annotation.with_configs(configs), {"input": x}, config)
    values = fp32_tensors(prepared.model, ["r1", "b2"], x)
    shared = max(np.abs(values["r1"]).max(), np.abs(values["b2"]).max()) / 127  # one observer saw both
    assert calibrated.configs["r1"].state is QuantState.ACTIVATED
    assert calibrated.configs["b2"].state is QuantState.PASSIVE
    assert calibrated.configs["b2"].scale == calibrated.configs["r1"].scale == pytest.approx(shared, rel=1e-6)


def test_progress_is_reported_per_batch(setup) -> None:
    prepared, x = setup
    config = QuantizeConfig(batch_size=8)
    calls = []
    calibrate(prepared, annotate(prepared, config), {"input": x}, config, progress=lambda *call: calls.append(call))
    assert [round(f, 3) for _, f, _ in calls] == [0.25, 0.5, 0.75, 1.0]
    assert {stage for stage, _, _ in calls} == {"calibrate"}


def test_non_finite_activation_is_reported_by_name(setup) -> None:
    prepared, x = setup
    config = QuantizeConfig()
    huge = np.full_like(x, 3e38)  # overflows to inf in the first convolution
    with pytest.raises(InvalidDataError, match="NaN/infinite"):
        calibrate(prepared, annotate(prepared, config), {"input": huge}, config)
