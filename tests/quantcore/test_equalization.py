"""Cross-layer equalization (``quantcore.prepare.equalization``) and empirical bias correction
(``quantcore.calibrate.bias_correction``): structure, FP32 function kept, and the quantized model's gain."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantcore import PreparedModel, QuantizeConfig, annotate, calibrate, export, prepare, quantize
from quantcore.calibrate.bias_correction import correct_biases
from quantcore.graph.index import GraphIndex
from quantcore.prepare.equalization import equalize, find_pairs
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.session import open_session

OUTLIER = 100.0  # channel 0 of the first layer's output scaled up by this, the second's column down by it


def _model(seed: int, *, activation: str = "Relu", second_groups: int = 1, outlier: float = OUTLIER) -> onnx.ModelProto:
    """input (N, 3, 8, 8) → conv1 (8 ch) → activation → conv2 (8 ch, ``second_groups`` groups) → Relu →
    conv3 (1x1, 4 ch) → output. Channel 0 of conv1 (weight and bias) is multiplied by ``outlier`` and
    conv2's weights reading it divided by it: the same function as the unscaled model, with the tensor
    between conv1 and conv2 spread over a range ``outlier`` times wider in one channel."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.normal(0, 0.3, (8, 3, 3, 3)), rng.normal(0.1, 0.1, 8)
    w2, b2 = rng.normal(0, 0.3, (8, 8 // second_groups, 3, 3)), rng.normal(0, 0.1, 8)
    w1[0] *= outlier
    b1[0] *= outlier
    w2[: 8 // second_groups, 0] /= outlier  # input channel 0: index 0 of group 0's output channels
    initializers = [
        numpy_helper.from_array(np.asarray(a, np.float32), name)
        for name, a in {
            "w1": w1,
            "b1": b1,
            "w2": w2,
            "b2": b2,
            "w3": rng.normal(0, 0.3, (4, 8, 1, 1)),
            "b3": rng.normal(0, 0.1, 4),
            "slope": np.full((8, 1, 1), 0.1),
        }.items()
    ]
    act_inputs = ["c1", "slope"] if activation == "PRelu" else ["c1"]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node(activation, act_inputs, ["a1"], name="act1"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], group=second_groups),
        helper.make_node("Relu", ["c2"], ["a2"], name="act2"),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["output"], name="conv3"),
    ]
    graph = helper.make_graph(
        nodes,
        "cle",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4, 8, 8])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _images(seed: int, n: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, 3, 8, 8)).astype(np.float32)


def _run(model: onnx.ModelProto | str, x: np.ndarray, outputs: tuple[str, ...] = ()) -> list[np.ndarray]:
    with open_session(model, outputs=outputs) as session:
        return session.run(["output", *outputs], {"input": x})


def _sqnr(reference: np.ndarray, value: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((reference - value) ** 2)))


def _quantized_output(tmp_path, prepared, config: QuantizeConfig, x: np.ndarray, calibration: np.ndarray):
    annotation = calibrate(prepared, annotate(prepared, config), {"input": calibration}, config)
    exported = export(prepared, annotation, tmp_path, platform=config.platform)
    return _run(str(exported.model_path), x)[0]


@pytest.mark.parametrize(
    ("activation", "groups"), [("Relu", 1), ("LeakyRelu", 1), ("PRelu", 1), ("Relu", 2), ("Relu", 8)]
)
def test_equalization_keeps_the_fp32_function_and_balances_ranges(tmp_path, activation: str, groups: int) -> None:
    model = _model(0, activation=activation, second_groups=groups)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    prepared = prepare(path)
    equalized, result = equalize(prepared)
    assert [(p.first, p.second, p.activation) for p in result.pairs] == [
        ("conv1", "conv2", "act1"),
        ("conv2", "conv3", "act2"),
    ]
    # the OUTLIER-scaled channel is undone: the composed scale of channel 0 is about OUTLIER
    assert result.max_log_scale > np.log(OUTLIER / 10)
    x = _images(1)
    before, after = _run(prepared.model, x)[0], _run(equalized.model, x)[0]
    # float32 rounding of the rescaled weights and of the reordered sums: about 1e-7 relative per
    # operation over a few hundred terms; 1e-4 of the output's scale bounds it with a wide margin
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-4 * np.abs(before).max())
    # the tensor between conv1 and conv2: its channel ranges spanned about OUTLIER x; equalization balances
    # the weights' ranges, which the activations follow up to the inputs' own spread (within 20x here)
    spreads = [np.abs(_run(m, x, ("c1",))[1]).max(axis=(0, 2, 3)) for m in (prepared.model, equalized.model)]
    assert spreads[0].max() / spreads[0].min() > OUTLIER / 2
    assert spreads[1].max() / spreads[1].min() < OUTLIER / 5
    np.testing.assert_array_equal(_run(prepared.model, x)[0], before)  # prepared left as it was


def test_clip_pairs_and_shared_tensors_are_not_equalized(tmp_path) -> None:
    model = _model(0, activation="Relu")
    for node in model.graph.node:
        if node.name == "act2":
            node.op_type = "Clip"  # Relu6-like once bounded: not positively homogeneous
            node.input[:] = ["c2", "lo", "hi"]
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
    )
    assert [(f.name, s.name) for f, s, _ in find_pairs(model.graph)] == [("conv1", "conv2")]
    model.graph.output.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, None))  # c1 read twice
    assert find_pairs(model.graph) == []


def test_equalization_improves_per_tensor_activation_quantization(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_model(0), path)
    prepared = prepare(path)
    equalized, _ = equalize(prepared)
    config = QuantizeConfig(platform="academic", precision="w8a8", observer="minmax")
    x, calibration = _images(1), _images(2, 128)
    reference = _run(prepared.model, x)[0]
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = _sqnr(reference, _quantized_output(tmp_path / "off", prepared, config, x, calibration))
    on = _sqnr(reference, _quantized_output(tmp_path / "on", equalized, config, x, calibration))
    # the per-tensor 8-bit activation between conv1 and conv2 gives the 7 normal channels about 2.5
    # levels when one channel spans OUTLIER x their range; equalized, all 8 share the grid (measured:
    # 7.3 dB off, 34.6 dB on)
    assert on > off + 15.0, (off, on)


def _bias_model(seed: int) -> onnx.ModelProto:
    """conv1 → Relu → conv2 → Relu → conv3, no outlier: with w4a8 on academic conv2's weights are 4 bit
    (conv1 and conv3 are the boundary layers, kept at 8), and its inputs, after a Relu, have a positive
    mean, so its rounding errors add up to a per-channel mean shift of its output."""
    return _model(seed, outlier=1.0)


def test_bias_correction_shrinks_the_mean_shift(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_bias_model(3), path)
    prepared = prepare(path)
    config = QuantizeConfig(platform="academic", precision="w4a8", observer="minmax")
    calibration, x = _images(2, 256), _images(1, 256)
    annotation = calibrate(prepared, annotate(prepared, config), {"input": calibration}, config)
    batches = Batches({"input": calibration}, input_specs(prepared.model), 32, what="calibration")
    corrected, result = correct_biases(prepared, annotation, batches, config, Monitor(None, None))
    assert set(result.corrected) == {"conv1", "conv2", "conv3"}
    (fp32,) = _run(prepared.model, x)[:1]

    def mean_shift(model: PreparedModel, out: str) -> float:
        """RMS over output channels of mean(quantized - FP32), on held-out data, of the exported model."""
        (tmp_path / out).mkdir()
        exported = export(model, annotation, tmp_path / out, platform=config.platform)
        quantized = _run(str(exported.model_path), x)[0]
        return float(np.sqrt(np.mean(np.mean(quantized - fp32, axis=(0, 2, 3)) ** 2)))

    before, after = mean_shift(prepared, "off"), mean_shift(corrected, "on")
    # measured 0.054 → 0.009 (seed 3): the weights' share of the shift is gone, what is left comes from the
    # activations' rounding and from held-out data's means differing from the calibration data's
    assert after < before / 3, (before, after)
    # only biases changed
    index, corrected_index = GraphIndex(prepared.model.graph), GraphIndex(corrected.model.graph)
    for name in ("w1", "w2", "w3"):
        np.testing.assert_array_equal(index.array(name), corrected_index.array(name))


def test_quantize_reports_both_options(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_model(0), path)
    messages: dict[str, str] = {}
    config = QuantizeConfig(
        platform="academic",
        precision="w8a8",
        equalization=True,
        bias_correction=True,
        cpu_latency=False,
        percentile_candidates=(),
    )
    result = quantize(
        path,
        {"input": _images(2, 64)},
        {"input": _images(1, 16)},
        config,
        tmp_path / "out",
        progress=lambda stage, fraction, message: messages.__setitem__(stage, message),
    )
    assert "equalized 2 layer pairs" in messages["prepare"]
    section = result.report["prepare"]["equalization"]
    assert len(section["pairs"]) == 2 and section["sweeps"] >= 1 and section["max_log_scale"] > 0
    assert result.report["prepare"]["smoothquant"] is None
    assert "bias correction: 3 layers corrected" in messages["calibrate"]
    assert result.report["config"]["equalization"] is True
    assert result.report["config"]["bias_correction"] is True
