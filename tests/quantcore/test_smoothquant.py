"""SmoothQuant (``quantcore.calibrate.smoothquant``): which layers share a smoothing factor, where the
division goes, the FP32 function kept, and the quantized model's gain on outlier activations."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantcore import QuantizeConfig, annotate, calibrate, export, prepare, quantize
from quantcore.auto.candidates import CANDIDATES
from quantcore.calibrate import smoothquant
from quantcore.calibrate.smoothquant import apply_smoothing, channel_maxima, find_groups, kept_alpha, smooth
from quantcore.export.qdq import build_qdq_model
from quantcore.graph.index import GraphIndex
from quantcore.numerics.paired_scores import SampleSums
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches, input_specs
from quantcore.runtime.session import open_session

D, T = 16, 8  # model width, tokens per sample
OUTLIERS = {3: 60.0, 11: 80.0}  # LayerNorm channel → its scale: channels this much larger than the rest


def _block(seed: int) -> onnx.ModelProto:
    """x (N, T, D) → LayerNorm (scale: channel 3 x60) → h → q/k/v MatMuls; softmax(q·kᵀ)·v → o MatMul →
    + x → LayerNorm (channel 11 x80) → h2 → MatMul + bias → Relu → MatMul → + h2 → output: a post-LN
    encoder layer whose LayerNorm outputs carry one channel 60-80x larger than the others, as LLMs' do, read
    through weight rows that much smaller (so the function is an ordinary layer's, as in a trained model).
    h is read by q, k and v alone (the division goes into its LayerNorm); h2 also by the residual Add (a
    Mul is inserted); q·kᵀ multiplies two activations (no constant weight: left alone)."""
    rng = np.random.default_rng(seed)
    scale1, scale2 = rng.normal(1.0, 0.1, D), rng.normal(1.0, 0.1, D)
    scale1[3], scale2[11] = OUTLIERS[3], OUTLIERS[11]
    arrays = {
        "ln1_scale": scale1,
        "ln1_bias": rng.normal(0, 0.1, D),
        "ln2_scale": scale2,
        "ln2_bias": rng.normal(0, 0.1, D),
        **{f"w{name}": rng.normal(0, D**-0.5, (D, D)) for name in "qkvo"},
        "w1": rng.normal(0, D**-0.5, (D, 2 * D)),
        "b1": rng.normal(0, 0.1, 2 * D),
        "w2": rng.normal(0, (2 * D) ** -0.5, (2 * D, D)),
        "temperature": np.float32(D**-0.5),
    }
    for name in "wq", "wk", "wv":  # trained layers read an outlier channel through small weights
        arrays[name][3] /= OUTLIERS[3]
    arrays["w1"][11] /= OUTLIERS[11]
    node = helper.make_node
    nodes = [
        node("LayerNormalization", ["x", "ln1_scale", "ln1_bias"], ["h"], name="ln1", axis=-1),
        *(node("MatMul", ["h", f"w{n}"], [n], name=f"{n}_proj") for n in "qkv"),
        node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        node("Mul", ["scores", "temperature"], ["scaled"], name="scaled"),
        node("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        node("MatMul", ["probs", "v"], ["attn"], name="attn"),
        node("MatMul", ["attn", "wo"], ["o"], name="o_proj"),
        node("Add", ["x", "o"], ["r1"], name="residual1"),
        node("LayerNormalization", ["r1", "ln2_scale", "ln2_bias"], ["h2"], name="ln2", axis=-1),
        node("MatMul", ["h2", "w1"], ["f1"], name="ff1"),
        node("Add", ["f1", "b1"], ["f1b"], name="ff1_bias"),
        node("Relu", ["f1b"], ["a1"], name="relu"),
        node("MatMul", ["a1", "w2"], ["f2"], name="ff2"),
        node("Add", ["h2", "f2"], ["output"], name="residual2"),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, D])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", T, D])],
        [numpy_helper.from_array(np.asarray(a, np.float32), name) for name, a in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inputs(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, T, D)).astype(np.float32)


def _prepared(tmp_path, model: onnx.ModelProto):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return prepare(path)


def _run(model: onnx.ModelProto | str, x: np.ndarray, exact_qdq: bool = False) -> np.ndarray:
    with open_session(model, exact_qdq=exact_qdq) as session:
        return session.run(None, {session.get_inputs()[0].name: x})[0]


def _sqnr(reference: np.ndarray, value: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(reference**2) / np.sum((reference - value) ** 2)))


def _maxima(prepared, x: np.ndarray) -> dict[str, np.ndarray]:
    groups = find_groups(prepared.model.graph)
    batches = Batches({"x": x}, input_specs(prepared.model), 16, what="calibration")
    return channel_maxima(prepared, groups, batches, QuantizeConfig(), Monitor())


def test_groups_share_an_input_and_skip_activation_products(tmp_path) -> None:
    prepared = _prepared(tmp_path, _block(0))
    groups = {g.input: g for g in find_groups(prepared.model.graph)}
    assert set(groups) == {"h", "attn", "h2", "a1"}  # "scores" (q · kᵀ) has no constant weight
    assert groups["h"].layers == ("q_proj", "k_proj", "v_proj")
    assert groups["h"].absorbed == (("ln1_scale", -1), ("ln1_bias", -1))  # h is read by the projections alone
    assert groups["h2"].absorbed is None  # also read by the residual Add
    assert groups["attn"].absorbed is None  # written by a MatMul of two activations
    # written by a Relu (homogeneous) of ff1's bias Add: ff1's bias and output columns absorb the division
    assert groups["a1"].absorbed == (("b1", -1), ("w1", -1))


def test_shared_input_gets_one_factor_and_the_division_is_absorbed(tmp_path) -> None:
    prepared = _prepared(tmp_path, _block(0))
    x = _inputs(1, 32)
    maxima = _maxima(prepared, x)
    groups = [g for g in find_groups(prepared.model.graph) if g.input in ("h", "h2")]
    smoothed = apply_smoothing(prepared, groups, maxima, 0.5)
    before, after = GraphIndex(prepared.model.graph), GraphIndex(smoothed.model.graph)
    # q, k and v rows all scaled by one s, s_j = sqrt(m_j / max over the three of max |W_j|)
    rows = np.max([np.abs(before.array(f"w{n}")).max(axis=1) for n in "qkv"], axis=0)
    expected = np.sqrt(maxima["h"] / rows)
    for n in "qkv":
        ratio = after.array(f"w{n}") / before.array(f"w{n}")
        np.testing.assert_allclose(ratio, np.broadcast_to(expected[:, None], ratio.shape), rtol=1e-5)
    np.testing.assert_allclose(after.array("ln1_scale"), before.array("ln1_scale") / expected, rtol=1e-5)
    # h2: a Mul by 1/s inserted before ff1 alone; the residual still reads h2
    (mul,) = [n for n in smoothed.model.graph.node if n.op_type == "Mul" and n.input[0] == "h2"]
    (ff1,) = [n for n in smoothed.model.graph.node if n.name == "ff1"]
    assert ff1.input[0] == mul.output[0]
    assert [n.name for n, _ in after.consumers["h2"]] == [mul.name, "residual2"]
    # the activation product is untouched
    (scores,) = [n for n in smoothed.model.graph.node if n.name == "scores"]
    assert list(scores.input) == ["q", "kt"]
    # the outlier channels' range is gone from the smoothed inputs: m_j / s_j = sqrt(m_j · r_j)
    assert np.max(maxima["h"]) / np.median(maxima["h"]) > 40
    flat = np.sqrt(maxima["h"] * rows)
    assert np.max(flat) / np.median(flat) < 10


@pytest.mark.parametrize("alpha", smoothquant.ALPHAS)
def test_smoothing_keeps_the_fp32_function(tmp_path, alpha: float) -> None:
    prepared = _prepared(tmp_path, _block(0))
    x = _inputs(1, 32)
    smoothed = apply_smoothing(prepared, find_groups(prepared.model.graph), _maxima(prepared, x), alpha)
    before, after = _run(prepared.model, x), _run(smoothed.model, x)
    # each rescaled constant is rounded to float32 once (2^-24 relative) and the MatMuls sum D = 16 to
    # 32 products of different magnitudes: errors of a few 1e-7 of the largest term, which is about the
    # output's scale (the LayerNorm outlier channels pass the residual); 1e-5 of it bounds them widely
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5 * np.abs(before).max())


def test_gemm_rows_and_a_gemm_producer_absorb(tmp_path) -> None:
    """x (N, 8) → Gemm g1 (transB, bias; output channel 2 x50) → Gemm g2 (no transB): g1's B rows and
    bias take ÷ s, g2's B rows · s; the function kept."""
    rng = np.random.default_rng(2)
    w1, b1, w2 = rng.normal(0, 0.3, (6, 8)), rng.normal(0, 0.1, 6), rng.normal(0, 0.3, (6, 4))
    w1[2] *= 50
    b1[2] *= 50
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["y"], name="g1", transB=1),
            helper.make_node("Gemm", ["y", "w2"], ["output"], name="g2"),
        ],
        "gemms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in {"w1": w1, "b1": b1, "w2": w2}.items()],
    )
    prepared = _prepared(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    groups = find_groups(prepared.model.graph)
    assert [(g.input, g.layers, g.absorbed) for g in groups] == [
        ("x", ("g1",), None),
        ("y", ("g2",), (("w1", -2), ("b1", -1))),
    ]
    x = rng.normal(0, 1, (64, 8)).astype(np.float32)
    batches = Batches({"x": x}, input_specs(prepared.model), 16, what="calibration")
    maxima = channel_maxima(prepared, groups, batches, QuantizeConfig(), Monitor())
    smoothed = apply_smoothing(prepared, groups[1:], maxima, 0.5)
    before, after = _run(prepared.model, x), _run(smoothed.model, x)
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5 * np.abs(before).max())  # as above
    assert [n.op_type for n in smoothed.model.graph.node] == ["Gemm", "Gemm"]  # absorbed: no Mul


def _quantized(tmp_path, prepared, config: QuantizeConfig, calibration: np.ndarray, x: np.ndarray) -> np.ndarray:
    annotation = calibrate(prepared, annotate(prepared, config), {"x": calibration}, config)
    tmp_path.mkdir()
    path = str(export(prepared, annotation, tmp_path, platform=config.platform).model_path)
    # a TensorRT engine accumulates int8 products in int32 as exact Q/DQ does; ONNX Runtime's u8s8 kernels
    # on a CPU without VNNI saturate pairs of them in int16, which the onnxruntime preset's grids allow for
    return _run(path, x, exact_qdq=config.platform == "tensorrt")


def _smoothing_gain(tmp_path, model: onnx.ModelProto, calibration: np.ndarray, x: np.ndarray, platform: str):
    """(what ``smooth`` did, held-out SQNR in dB of ``model`` quantized without it, with it): minmax 8-bit."""
    prepared = _prepared(tmp_path, model)
    config = QuantizeConfig(platform=platform, observer="minmax")
    batches = Batches({"x": calibration}, input_specs(prepared.model), 16, what="calibration")
    smoothed, result = smooth(prepared, batches, config)
    reference = _run(prepared.model, x)
    off = _sqnr(reference, _quantized(tmp_path / "off", prepared, config, calibration, x))
    on = _sqnr(reference, _quantized(tmp_path / "on", smoothed, config, calibration, x))
    return result, off, on


@pytest.mark.parametrize("platform", ["onnxruntime", "tensorrt"])
def test_smoothquant_improves_per_tensor_activation_quantization(tmp_path, platform: str) -> None:
    result, off, on = _smoothing_gain(tmp_path, _block(0), _inputs(2, 64), _inputs(3, 64), platform)
    assert {g.input for g in result.groups} == {"h", "h2"}  # the two LayerNorm outputs: ratios 60-80
    assert result.alpha in smoothquant.ALPHAS and result.scores[result.alpha] > result.scores[None]
    # per-tensor 8-bit h and h2 leave the 15 ordinary channels 2-4 levels when one channel spans 60-80x
    # their range; smoothed, the channels share the grid. Held-out samples; measured 13.4 → 40.8 dB
    # (onnxruntime), 13.0 → 39.9 dB (tensorrt)
    assert on > off + 15.0, (off, on)


def test_alphas_are_scored_on_calibration_samples_they_were_not_calibrated_on(tmp_path) -> None:
    """The last half of 64 calibration samples spans 3x the first (the residual path carries it past the
    LayerNorms): ranges calibrated on the first 32 clip it, which only a score on held-out samples sees."""
    prepared = _prepared(tmp_path, _block(0))
    config = QuantizeConfig(platform="tensorrt", observer="minmax")
    calibration = _inputs(2, 64)
    calibration[32:] *= 3.0
    batches = Batches({"x": calibration}, input_specs(prepared.model), 16, what="calibration")
    _, result = smooth(prepared, batches, config)
    assert (result.samples, result.held_out) == (32, True)
    assert "on 32 held-out calibration samples" in result.statement()

    def unsmoothed_sqnr(scored: np.ndarray) -> float:
        calibrated = calibrate(prepared, annotate(prepared, config), {"x": calibration[:32]}, config)
        with open_session(build_qdq_model(prepared, calibrated), exact_qdq=True) as session:
            return _sqnr(_run(prepared.model, scored), session.run(None, {"x": scored})[0])

    # the same exact Q/DQ run of the same samples, batched differently: float32 sums, 0.01 dB
    assert result.scores[None] == pytest.approx(unsmoothed_sqnr(calibration[32:]), abs=0.01)
    # in-sample the same model reads better (measured 15.3 against 13.0 dB): the scores could not agree by chance
    assert unsmoothed_sqnr(calibration[:32]) > result.scores[None] + 1.0

    few = _inputs(2, 12)  # too few to hold 8 out of both parts: scored on the samples calibrated on
    _, result = smooth(prepared, Batches({"x": few}, input_specs(prepared.model), 16, what="calibration"), config)
    assert (result.samples, result.held_out) == (12, False)
    assert "on 12 calibration samples;" in result.statement()


def _noise_sums(noise: np.ndarray) -> SampleSums:
    """SQNR sums of 32 samples of unit signal energy and the given per-sample noise energies."""
    ones = np.ones_like(noise)
    return SampleSums("sqnr", {"output": np.stack([ones, ones, ones, noise], axis=1)})


def test_an_alpha_is_kept_only_when_it_beats_the_unsmoothed_model_beyond_the_noise_of_the_samples() -> None:
    unsmoothed = _noise_sums(np.full(32, 0.01))  # 20.0 dB
    lucky = np.full(32, 0.001)
    lucky[7] = 0.25  # 20.6 dB over all 32, the best score; resamples holding sample 7 twice read worse
    steady = np.full(32, 0.0093)  # 20.3 dB: better than unsmoothed on every resample
    alpha, gain = kept_alpha({None: unsmoothed, 0.4: _noise_sums(lucky)})
    assert alpha is None and gain.value > 0 and gain.low < 0
    alpha, gain = kept_alpha({None: unsmoothed, 0.4: _noise_sums(lucky), 0.6: _noise_sums(steady)})
    assert alpha == 0.6 and gain.low > 0


def test_quantize_reports_smoothquant_and_runs_nothing_when_off(tmp_path, monkeypatch) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_block(0), path)
    messages: dict[str, str] = {}
    config = QuantizeConfig(platform="onnxruntime", smoothquant=True, cpu_latency=False, percentile_candidates=())
    result = quantize(
        path,
        {"x": _inputs(2, 64)},
        {"x": _inputs(3, 16)},
        config,
        tmp_path / "on",
        progress=lambda stage, fraction, message: messages.__setitem__(stage, message),
    )
    assert "smoothquant: 4 layers smoothed in 2 groups, alpha = " in messages["prepare"]
    assert result.report["config"]["smoothquant"] is True
    section = result.report["prepare"]["smoothquant"]  # the message's figures, for a reader of the report
    assert (section["scored_on_samples"], section["held_out"]) == (32, True)
    assert {g["input"] for g in section["smoothed"]} == {"h", "h2"}
    assert f"alpha = {section['alpha']:g} " in messages["prepare"]
    assert section["scores_db"][f"{section['alpha']:g}"] > section["scores_db"]["unsmoothed"]
    assert result.report["prepare"]["equalization"] is None

    def refuse(*args, **kwargs):
        raise AssertionError("smoothquant ran with the option off")

    monkeypatch.setattr("quantcore.pipeline.quantization.smooth", refuse)
    off = quantize(
        path, {"x": _inputs(2, 64)}, {"x": _inputs(3, 16)}, QuantizeConfig(cpu_latency=False), tmp_path / "off"
    )
    assert off.report["config"]["smoothquant"] is False and off.report["prepare"]["smoothquant"] is None


C = 8  # channels of the convolution model's feature maps
CONV_OUTLIER = (2, 40.0)  # channel of c0's output → how much larger than the others


def _convolutions(seed: int) -> onnx.ModelProto:
    """x (N, 3, 8, 8) → Conv c0 (3x3, bias; output channel 2 x40) → y0 → Conv c1 (3x3) → y1 → Mul a → Add b
    (scalars: a per-tensor affine step) → y2 → depthwise Conv dw (3x3, bias) → y3 → Relu → MaxPool (2x2) →
    y5 → Conv c3 (1x1, 2 groups, 8 → 4) → output. c1 reads channel 2 through weights 40x smaller, so the
    function is an ordinary CNN's while y0 carries one channel 40x the others' range."""
    rng = np.random.default_rng(seed)
    channel, factor = CONV_OUTLIER
    arrays = {
        "w0": rng.normal(0, 0.3, (C, 3, 3, 3)),
        "b0": rng.normal(0, 0.1, C),
        "w1": rng.normal(0, 0.1, (C, C, 3, 3)),
        "a": np.float32(0.7),
        "b": np.float32(0.2),
        "wd": rng.normal(0, 0.3, (C, 1, 3, 3)),
        "bd": rng.normal(0, 0.1, C),
        "w3": rng.normal(0, 0.3, (4, C // 2, 1, 1)),
    }
    arrays["w0"][channel] *= factor
    arrays["b0"][channel] *= factor
    arrays["w1"][:, channel] /= factor
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["y0"], name="c0", pads=[1, 1, 1, 1]),
        node("Conv", ["y0", "w1"], ["y1"], name="c1", pads=[1, 1, 1, 1]),
        node("Mul", ["y1", "a"], ["ya"], name="scale"),
        node("Add", ["ya", "b"], ["y2"], name="shift"),
        node("Conv", ["y2", "wd", "bd"], ["y3"], name="dw", pads=[1, 1, 1, 1], group=C),
        node("Relu", ["y3"], ["y4"], name="relu"),
        node("MaxPool", ["y4"], ["y5"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        node("Conv", ["y5", "w3"], ["output"], name="c3", group=2),
    ]
    graph = helper.make_graph(
        nodes,
        "convolutions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4, 4, 4])],
        [numpy_helper.from_array(np.asarray(a, np.float32), name) for name, a in arrays.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _images(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, 3, 8, 8)).astype(np.float32)


def test_conv_groups_absorb_into_convs_affine_steps_and_through_relu_and_max_pool(tmp_path) -> None:
    prepared = _prepared(tmp_path, _convolutions(0))
    assert find_groups(prepared.model.graph) == []  # Conv groups only when asked for
    groups = {g.input: g for g in find_groups(prepared.model.graph, convolutions=True)}
    # x is a graph input: a Conv group gets no inserted Mul, so it is no group
    assert set(groups) == {"y0", "y2", "y5"}
    assert {g.axis for g in groups.values()} == {1}
    assert groups["y0"].absorbed == (("w0", -4), ("b0", -1))  # c0's output channels
    assert groups["y2"].absorbed == (("b", -3), ("a", -3))  # the scalars become (C, 1, 1)
    assert groups["y5"].absorbed == (("wd", -4), ("bd", -1))  # through MaxPool and Relu to the depthwise Conv


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_conv_smoothing_keeps_the_fp32_function_and_scales_each_groups_filters(tmp_path, alpha: float) -> None:
    prepared = _prepared(tmp_path, _convolutions(0))
    x = _images(1, 32)
    groups = find_groups(prepared.model.graph, convolutions=True)
    batches = Batches({"x": x}, input_specs(prepared.model), 16, what="calibration")
    maxima = channel_maxima(prepared, groups, batches, QuantizeConfig(), Monitor())
    smoothed = apply_smoothing(prepared, groups, maxima, alpha)
    before, after = _run(prepared.model, x), _run(smoothed.model, x)
    # float32 rounding of each rescaled constant (2^-24 relative) through sums of 9 to 72 products: errors of
    # a few 1e-7 of the largest term; 1e-5 of the output's range bounds them widely
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5 * np.abs(before).max())
    was, now = GraphIndex(prepared.model.graph), GraphIndex(smoothed.model.graph)
    # c3 (2 groups of 4 input channels): channel j scales column j mod 4 of its own group's two filters
    s = (maxima["y5"] ** alpha) / (np.abs(was.array("w3")).reshape(2, 2, 4).max(axis=1).reshape(-1) ** (1 - alpha))
    ratio = (now.array("w3") / was.array("w3"))[:, :, 0, 0]  # (4 filters, 4 columns)
    np.testing.assert_allclose(ratio, np.stack([s[:4], s[:4], s[4:], s[4:]]), rtol=1e-5)
    # the affine step's scalar now holds one value per channel of y2
    assert now.array("a").shape == (C, 1, 1)


@pytest.mark.parametrize("platform", ["onnxruntime", "tensorrt"])
def test_conv_smoothing_improves_per_tensor_activation_quantization(tmp_path, platform: str) -> None:
    result, off, on = _smoothing_gain(tmp_path, _convolutions(0), _images(2, 64), _images(3, 64), platform)
    assert "y0" in {g.input for g in result.groups}  # the outlier channel's feature map
    assert result.alpha is not None and result.scores[result.alpha] > result.scores[None]
    # per-tensor 8-bit y0 leaves its 7 ordinary channels a few levels when channel 2 spans 40x their
    # range (outlier ratio 36.9); smoothed, they share the grid. Held-out samples; measured 14.9 → 38.8 dB
    # (onnxruntime), 14.7 → 38.0 dB (tensorrt)
    assert on > off + 15.0, (off, on)


def test_the_auto_candidate_is_tried_on_a_cnn_whose_feature_maps_can_absorb_the_division(tmp_path) -> None:
    (candidate,) = [c for c in CANDIDATES if c.name == "smoothquant"]
    config = QuantizeConfig(platform="tensorrt")
    assert candidate.unchanged(_prepared(tmp_path, _convolutions(0)), config) is None
    # a lone Conv reads the graph input: nothing to absorb the division, so no group
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w0"], ["output"], name="c0")],
        "lone",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", C, 6, 6])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (C, 3, 3, 3)).astype(np.float32), "w0")],
    )
    lone = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    why = candidate.unchanged(_prepared(tmp_path, lone), config)
    assert why == "no MatMul/Gemm or Conv reading an activation through its own weight"
