"""Layer-wise analysis: a planted bad layer ranked first, the switchable model's two ends equal FP32 and
the exported model, range statistics, the bounds on the layer-wise runs, and every zoo model analysed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantcore import QuantizeConfig, annotate, calibrate, export, prepare
from quantcore.analysis.ranges import RangeStats
from quantcore.analysis.ranking import affordable, analyze
from quantcore.analysis.switch import MASK_INPUT, gated_model, switchable_model
from quantcore.config import AnalysisOptions
from quantcore.numerics.metrics import OutputAgreement
from quantcore.numerics.tqc import TensorQuantConfig
from quantcore.runtime.session import EXACT_OPTIMIZATION, open_session
from samples import zoo
from tests.quantcore.models import planted_outlier, save

CONFIG = QuantizeConfig(platform="tensorrt", cpu_latency=False)


def planted_case(tmp_path_factory, config: QuantizeConfig):
    """The planted-outlier CNN prepared and calibrated for ``config`` on 64 samples, and 32 held-out ones."""
    path = save(planted_outlier(), tmp_path_factory.mktemp("planted") / "planted.onnx")
    data = np.random.default_rng(1).normal(size=(96, 3, 8, 8)).astype(np.float32)
    prepared = prepare(path)
    calibrated = calibrate(prepared, annotate(prepared, config), {"input": data[:64]}, config)
    return prepared, calibrated, {"input": data[64:]}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_case(tmp_path_factory, CONFIG)


def test_planted_outlier_layer_is_ranked_first(planted) -> None:
    prepared, calibrated, evaluation = planted
    report = analyze(prepared, calibrated, evaluation, CONFIG)
    layers = report["layers"]
    assert [row["rank"] for row in layers] == list(range(1, len(layers) + 1))
    assert layers[0]["node"] == "conv3" and set(layers[0]["tensors"]) == {"r2", "conv3.w"}
    # Quantizing conv3's input alone: seven of its eight channels fall to a handful of levels of a scale
    # set by the 1000x channel, so the logits keep little of their signal (measured 0.2 dB); every other
    # layer alone costs what 8 bits cost on ordinary data (measured 38-44 dB). 10 and 30 dB leave margin.
    assert layers[0]["sqnr_db"] < 10
    assert all(row["sqnr_db"] > 30 for row in layers[1:])
    tensors = {row["tensor"]: row for row in report["tensors"]}
    # conv2's weights carry the planted channel: its |max| is ~1000x the median channel's (measured 766).
    assert tensors["conv2.w"]["channel_range_ratio"] > 100
    assert tensors["conv3.w"]["channel_range_ratio"] < 3  # ordinary N(0, 0.3) channels
    # The per-tensor local SQNR of r2 looks fine (its energy is all in the wide channel): only the
    # layer-wise run exposes the damage, which is why the ranking uses it.
    assert tensors["r2"]["local_sqnr_db"] > 25
    assert tensors["flat"]["graphwise_sqnr_db"] < 10 < tensors["flat"]["local_sqnr_db"]
    assert report["layerwise"]["layers_analyzed"] == report["layerwise"]["layers_total"] == 4
    assert report["layerwise"]["layer_run_fraction"] > 0  # measured wall time: no bound asserted


def test_switchable_model_ends_are_fp32_and_the_exported_model(planted, tmp_path) -> None:
    prepared, calibrated, evaluation = planted
    switchable = switchable_model(prepared, calibrated)
    batch = {"input": evaluation["input"][:8]}
    exported = export(prepared, calibrated, tmp_path)
    k = len(switchable.layers)
    options = {"exact_qdq": True, "optimization": EXACT_OPTIMIZATION}
    with (
        open_session(switchable.model, **options) as session,
        open_session(prepared.model, optimization=EXACT_OPTIMIZATION) as fp32,
        open_session(exported.model_path, **options) as qdq,
    ):
        off = session.run(["logits"], {**batch, MASK_INPUT: np.zeros(k, bool)})[0]
        on = session.run(["logits"], {**batch, MASK_INPUT: np.ones(k, bool)})[0]
        reference = fp32.run(["logits"], batch)[0]
        quantized = qdq.run(["logits"], batch)[0]
    # Where() only selects tensors: the same kernels on the same values, so equal to float rounding of
    # a re-ordered graph (1e-5 relative to logits of magnitude ~1-10).
    np.testing.assert_allclose(off, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(on, quantized, rtol=1e-5, atol=1e-5)
    assert np.abs(on - off).max() > 0.1  # and quantization does change the logits


@pytest.mark.parametrize(
    ("name", "platform"), [("resnet", "tensorrt"), ("transformer", "tensorrt"), ("unet", "onnxruntime")]
)
def test_gated_model_switches_each_layer_as_the_switchable_model_does(name: str, platform: str, tmp_path) -> None:
    # The layer-wise runs use the gated model (If per layer), the graph-wise ones the switchable model
    # (Where per input): every flag pattern the layer-wise runs use gives the same outputs in both.
    model = zoo.build(name)
    config = QuantizeConfig(platform=platform, cpu_latency=False, batch_size=4)
    prepared = prepare(save(model.model, tmp_path / f"{name}.onnx"))
    calibrated = calibrate(prepared, annotate(prepared, config), model.calibration, config)
    switchable, gated = switchable_model(prepared, calibrated), gated_model(prepared, calibrated)
    onnx.checker.check_model(gated.model, full_check=True)
    assert gated.layers == switchable.layers and len(gated.layers) > 3
    assert [o.name for o in gated.model.graph.output] == list(gated.outputs)  # nothing else is fetched
    batch = {key: value[:4] for key, value in model.evaluation.items()}
    options = {"exact_qdq": True, "optimization": EXACT_OPTIMIZATION}
    k = len(gated.layers)
    masks = [np.zeros(k, bool), np.ones(k, bool), *np.eye(k, dtype=bool)]
    with open_session(gated.model, **options) as fast, open_session(switchable.model, **options) as slow:
        for mask in masks:
            got = fast.run(list(gated.outputs), {**batch, MASK_INPUT: mask})
            want = slow.run(list(gated.outputs), {**batch, MASK_INPUT: mask})
            for a, b in zip(got, want, strict=True):
                # the same arithmetic; only a float layer's kernel may differ (the gated model's keep their
                # weights as initializers, which ONNX Runtime pre-packs), so float32 rounding of reordered
                # sums: measured 0 on these models, 2e-5 of the largest output on a PaddleOCR recognizer.
                # One layer's quantization moves these outputs by 2e-3 to 2e-2 of the largest (measured).
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(1.0, float(np.abs(b).max())))


def test_range_stats_count_only_values_the_grid_saturates() -> None:
    tqc = TensorQuantConfig(num_bits=8, symmetric=True).with_scale(np.float32(0.1), 0)
    stats = RangeStats(tqc)
    # int8 symmetric at s = 0.1 represents [-12.8, 12.7]; values within half a step of an end round onto
    # it (12.74 → 127), beyond that they saturate: -20, 12.76 and 12.9 of these five.
    stats.update(np.array([-20.0, 0.0, 12.74, 12.76, 12.9], np.float32))
    result = stats.result()
    assert result["clipped_fraction"] == pytest.approx(3 / 5)
    assert result["range_min"] == pytest.approx(-12.8) and result["range_max"] == pytest.approx(12.7)
    assert result["observed_min"] == -20.0 and result["observed_max"] == pytest.approx(12.9)


def test_layerwise_runs_are_bounded_and_stated(planted) -> None:
    prepared, calibrated, evaluation = planted
    options = AnalysisOptions(layerwise_samples=8, max_layers=2, graphwise_samples=16)
    report = analyze(prepared, calibrated, evaluation, CONFIG, options=options)
    layerwise = report["layerwise"]
    assert layerwise["samples"] == 8 and report["graphwise"]["samples"] == 16
    assert layerwise["layers_analyzed"] == 2 and layerwise["runs_per_batch"] == 3
    assert "for 2 of 4 layers" in layerwise["statement"]
    analyzed = [row for row in report["layers"] if row["analyzed"]]
    skipped = [row for row in report["layers"] if not row["analyzed"]]
    assert [row["rank"] for row in analyzed] == [1, 2] and all(row["sqnr_db"] is None for row in skipped)
    # The two chosen are those whose own quantization loses most at their inputs.
    worst_local = sorted(report["layers"], key=lambda row: row["local_sqnr_db"])[:2]
    assert {row["node"] for row in analyzed} == {row["node"] for row in worst_local}


def test_layerwise_budget_takes_fewer_samples_then_fewer_layers() -> None:
    # 10 s with a reference run of 0.1 s and four layer runs of 0.1 s a sample: 0.5 s a sample, 20 samples
    assert affordable(10.0, 0.1, [0.1] * 4, 1, 64) == (20, 4)
    assert affordable(10.0, 0.1, [0.1] * 4, 1, 8) == (8, 4)  # all the samples there are
    assert affordable(10.0, 0.1, [0.05] * 4, 1, 64) == (33, 4)  # layers on a part of the graph cost less
    assert affordable(10.0, 0.4, [0.1] * 4, 1, 64) == (12, 4)  # four groups: four reference runs a sample
    assert affordable(10.0, 1.0, [1.0] * 40, 1, 64) == (1, 9)  # one sample over 40 layers is 41 s: 1 + 9 runs fit
    assert affordable(10.0, 1.0, [2.0, 0.5, 7.0, 0.5], 1, 64) == (1, 2)  # the first layers that fit, in order
    assert affordable(10.0, 1.0, [1.0], 4, 64) == (20, 1)  # a fixed batch of 4 is the unit: 5 batches of 2 runs
    assert affordable(0.5, 1.0, [1.0] * 40, 1, 64) == (1, 1)  # one layer at least
    for bad in (0, -1.0, float("inf"), True, "60"):
        with pytest.raises(ValueError, match="layerwise_seconds"):
            AnalysisOptions(layerwise_seconds=bad)


def test_layerwise_runs_held_to_their_budget_are_stated(planted) -> None:
    prepared, calibrated, evaluation = planted
    free = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=None))
    assert free["layerwise"]["samples"] == 32 and free["layerwise"]["layers_analyzed"] == 4
    assert "held" not in free["layerwise"]["statement"]
    held = analyze(prepared, calibrated, evaluation, CONFIG, options=AnalysisOptions(layerwise_seconds=1e-9))
    layerwise = held["layerwise"]
    assert layerwise["samples"] == 1 and layerwise["layers_analyzed"] == 1 and layerwise["seconds_per_run"] > 0
    assert "for 1 of 4 layers" in layerwise["statement"] and "held to 1e-09 s as priced" in layerwise["statement"]
    # the one layer kept is the one whose own quantization loses most at its inputs
    worst = min(held["layers"], key=lambda row: row["local_sqnr_db"])
    assert [row["node"] for row in held["layers"] if row["analyzed"]] == [worst["node"]]


def _exposed_rows(prepared, calibrated, evaluation: dict, batch_size: int) -> dict[str, dict]:
    """The graph-wise rows computed the direct way: every activation and its dequantized value fetched as
    outputs of the switchable model's runs with every flag off and every flag on, reduced in numpy."""
    switchable = switchable_model(prepared, calibrated)
    names = [t for t in calibrated.activations if t in switchable.dequantized]
    dequantized = [switchable.dequantized[t] for t in names]
    stats = {t: RangeStats(calibrated.configs[t]) for t in names}
    local = {t: OutputAgreement(argmax=False) for t in names}
    graphwise = {t: OutputAgreement(argmax=False) for t in names}
    samples = len(next(iter(evaluation.values())))
    off_mask, on_mask = (np.full(len(switchable.layers), flag) for flag in (False, True))
    with open_session(switchable.model, exact_qdq=True) as session:
        for start in range(0, samples, batch_size):
            batch = {name: array[start : start + batch_size] for name, array in evaluation.items()}
            fetched = [t for t in names if t not in batch] + dequantized
            values = session.run(fetched, {**batch, MASK_INPUT: off_mask})
            off = {**batch, **dict(zip(fetched, values, strict=True))}
            values = session.run(dequantized, {**batch, MASK_INPUT: on_mask})
            on = dict(zip(dequantized, values, strict=True))
            for t, d in zip(names, dequantized, strict=True):
                stats[t].update(off[t])
                local[t].update(off[t], off[d])
                graphwise[t].update(off[t], on[d])
    return {
        t: {
            "graphwise_sqnr_db": graphwise[t].result()["sqnr_db"],
            "local_sqnr_db": local[t].result()["sqnr_db"],
            **stats[t].result(),
        }
        for t in names
    }


@pytest.mark.parametrize("platform", ["tensorrt", "onnxruntime"])
def test_graphwise_sums_reduced_in_the_graph_equal_those_of_the_exposed_tensors(planted, platform) -> None:
    prepared, _, evaluation = planted
    config = QuantizeConfig(platform=platform, cpu_latency=False)
    calibrated = calibrate(prepared, annotate(prepared, config), evaluation, config)
    report = analyze(prepared, calibrated, evaluation, config, options=AnalysisOptions(layerwise_samples=4))
    assert report["graphwise"] == {"samples": 32, "runs_per_batch": 1, "batch_size": config.batch_size}
    rows = {row["tensor"]: row for row in report["tensors"] if row["kind"] == "activation"}
    expected = _exposed_rows(prepared, calibrated, evaluation, config.batch_size)
    assert set(rows) == set(expected) and len(rows) >= 4
    for t, want in expected.items():
        for key in ("observed_min", "observed_max", "range_min", "range_max"):  # the same float32 values
            assert rows[t][key] == want[key], (t, key)
        # In the graph the sums are float32 within a batch (ONNX Runtime's reductions), in numpy float64:
        # for the 8x8 maps of 512 values a sample here that changes a sum's 7th digit, an SQNR by well
        # under 0.001 dB. The saturated values are counted against bounds rounded to float32.
        for key in ("graphwise_sqnr_db", "local_sqnr_db"):
            assert rows[t][key] == pytest.approx(want[key], abs=1e-3), (t, key)
        assert rows[t]["clipped_fraction"] == pytest.approx(want["clipped_fraction"], abs=1e-6), t


def _branching_model() -> onnx.ModelProto:
    """x (N, 8) → MatMul → h → If(Σx > 0) {then: h·w; else: -h} → y → MatMul → out: the branches read
    h, which the quantized first layer changes, from the outer scope."""
    rng = np.random.default_rng(3)

    def init(name, shape):
        return numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name)

    def branch(name, node):
        return helper.make_graph(
            [node], name, [], [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)]
        )

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
        helper.make_node(
            "If",
            ["positive"],
            ["y"],
            name="choose",
            then_branch=branch("then", helper.make_node("Mul", ["h", "scale"], ["scaled"], name="scale_h")),
            else_branch=branch("else", helper.make_node("Neg", ["h"], ["negated"], name="negate_h")),
        ),
        helper.make_node("MatMul", ["y", "w2"], ["out"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "branching",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])],
        [init("w1", (8, 8)), init("w2", (8, 4)), init("scale", (8,)), numpy_helper.from_array(np.float32(0), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_graphwise_sums_follow_outer_tensors_into_subgraphs(tmp_path) -> None:
    # Where the float copy's If read the quantized copy's h, y's FP32 range and both its SQNRs would be
    # measured against the quantized model's values: the comparison with the exposed tensors catches it.
    prepared = prepare(save(_branching_model(), tmp_path / "branching.onnx"))
    data = {"x": np.random.default_rng(4).normal(size=(64, 8)).astype(np.float32)}
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False, batch_size=4)  # batches of both signs
    calibrated = calibrate(prepared, annotate(prepared, config), data, config)
    assert {"x", "y"} <= set(calibrated.activations)
    report = analyze(prepared, calibrated, data, config, options=AnalysisOptions(layerwise_samples=4))
    rows = {row["tensor"]: row for row in report["tensors"] if row["kind"] == "activation"}
    for t, want in _exposed_rows(prepared, calibrated, data, config.batch_size).items():
        assert rows[t]["observed_max"] == want["observed_max"], t
        assert rows[t]["graphwise_sqnr_db"] == pytest.approx(want["graphwise_sqnr_db"], abs=1e-3), t


@pytest.mark.parametrize("name", ["resnet", "mobilenet", "unet", "detector", "transformer", "audio", "branchy"])
def test_every_zoo_model_is_analysed(name: str, tmp_path) -> None:
    model = zoo.build(name)
    path = save(model.model, tmp_path / f"{name}.onnx")
    config = QuantizeConfig(platform="tensorrt", cpu_latency=False, batch_size=4)
    prepared = prepare(path)
    calibrated = calibrate(prepared, annotate(prepared, config), model.calibration, config)
    report = analyze(prepared, calibrated, model.evaluation, config, options=AnalysisOptions(layerwise_samples=4))
    assert report["layers"], name
    activations = [row for row in report["tensors"] if row["kind"] == "activation"]
    assert len(activations) == len(calibrated.activations)
    # 8-bit quantization of random-weight networks: every measured figure is a finite, sane SQNR.
    for row in activations:
        assert row["local_sqnr_db"] is None or row["local_sqnr_db"] > 10, (name, row)
    assert all(row["sqnr_db"] is None or np.isfinite(row["sqnr_db"]) for row in report["layers"])
    onnx.checker.check_model(switchable_model(prepared, calibrated).model)


def _nhwc_upsampling_model() -> onnx.ModelProto:
    """A tf2onnx-style decoder step in NHWC: x (N, 16, 16, 1) → Transpose → Conv → Relu (skip) → strided Conv
    → Relu → Transpose to NHWC → a Keras ``Repeat`` upsampling twice (Unsqueeze → Tile → Reshape, a
    Transpose between) → Transpose back to NCHW = up → Concat(up, skip) → a 1x1 Conv (y) and, through a
    Transpose to NHWC and a Relu, y2. ONNX Runtime 1.32's TransposeOptimizer pushes up's Transpose below
    its Q/DQ towards the one after the Concat, and leaves the dequantized value's other reader, the
    analysis twin's error Sub, with the NHWC tensor (AFIS's LEADER minutiae extractor, a tf2onnx model,
    showed it)."""
    rng = np.random.default_rng(5)
    channels = 4

    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value), name)

    def weight(name: str, shape: tuple[int, ...], std: float) -> onnx.TensorProto:
        return const(name, rng.normal(0, std, shape).astype(np.float32))

    repeat = [  # (N, h, w, C) -> (N, h, 2w, C)
        ("Unsqueeze", ["axis3"]),
        ("Tile", ["twice"]),
        ("Reshape", ["merge"]),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_nchw"], name="to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["x_nchw", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["skip"], name="relu1"),
        helper.make_node("Conv", ["skip", "w2", "b2"], ["c2"], name="conv2", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Transpose", ["r2"], ["r2_nhwc"], name="to_nhwc", perm=[0, 2, 3, 1]),
    ]
    source = "r2_nhwc"
    for step in ("w", "h"):
        for op, extra in repeat:
            nodes.append(helper.make_node(op, [source, *extra], [f"{op}_{step}"], name=f"{op.lower()}_{step}"))
            source = f"{op}_{step}"
        if step == "w":
            nodes.append(helper.make_node("Transpose", [source], ["swapped"], name="swap_hw", perm=[0, 2, 1, 3]))
            source = "swapped"
    nodes += [
        helper.make_node("Transpose", [source], ["up"], name="up_to_nchw", perm=[0, 3, 2, 1]),
        helper.make_node("Concat", ["up", "skip"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "w3", "b3"], ["y"], name="conv3", kernel_shape=[1, 1]),
        helper.make_node("Transpose", ["cat"], ["cat_nhwc"], name="cat_to_nhwc", perm=[0, 2, 3, 1]),
        helper.make_node("Relu", ["cat_nhwc"], ["y2"], name="relu_out"),
    ]
    initializers = [
        weight("w1", (channels, 1, 3, 3), 0.5),
        const("b1", np.zeros(channels, np.float32)),
        weight("w2", (channels, channels, 2, 2), 0.3),
        const("b2", np.zeros(channels, np.float32)),
        weight("w3", (2, 2 * channels, 1, 1), 0.3),
        const("b3", np.zeros(2, np.float32)),
        const("axis3", np.array([3], np.int64)),
        const("twice", np.array([1, 1, 1, 2, 1], np.int64)),
        const("merge", np.array([0, 0, -1, channels], np.int64)),
    ]
    graph = helper.make_graph(
        nodes,
        "nhwc_upsampling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 16, 1])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 16, 16]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["N", 16, 16, 2 * channels]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("platform", ["tensorrt", "onnxruntime"])
def test_graphwise_sums_of_an_nhwc_model_whose_transposes_onnx_runtime_moves(platform: str, tmp_path) -> None:
    # With the TransposeOptimizer in the twin's session ONNX Runtime refused the twin ("Sub: Incompatible
    # dimensions") and the job failed in its analysis.
    prepared = prepare(save(_nhwc_upsampling_model(), tmp_path / "nhwc.onnx"))
    data = {"x": np.random.default_rng(6).normal(size=(32, 16, 16, 1)).astype(np.float32)}
    config = QuantizeConfig(platform=platform, cpu_latency=False, batch_size=8)
    calibrated = calibrate(prepared, annotate(prepared, config), data, config)
    assert "up" in calibrated.activations
    report = analyze(prepared, calibrated, data, config, options=AnalysisOptions(layerwise_samples=4))
    rows = {row["tensor"]: row for row in report["tensors"] if row["kind"] == "activation"}
    expected = _exposed_rows(prepared, calibrated, data, config.batch_size)
    assert set(rows) == set(expected)
    for t, want in expected.items():
        assert rows[t]["observed_max"] == want["observed_max"], t
        # float32 sums within a batch against numpy's float64 (see the test above)
        assert rows[t]["graphwise_sqnr_db"] == pytest.approx(want["graphwise_sqnr_db"], abs=1e-3), t
        assert rows[t]["local_sqnr_db"] == pytest.approx(want["local_sqnr_db"], abs=1e-3), t
