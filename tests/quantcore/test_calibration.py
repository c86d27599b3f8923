"""calibrate: scales from streamed activations, weights, shared scales, progress."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from quantcore import InvalidDataError, QuantizeConfig, QuantState, annotate, calibrate, prepare, quantize
from quantcore.calibrate import calibration
from quantcore.calibrate.calibration import ActivationFetcher
from quantcore.numerics.scaling import scale_offset
from quantcore.runtime.batching import Batches, input_specs
from samples.tiny import stateful_data, stateful_model
from tests.quantcore.models import conv_bn_residual, save


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


def test_inputs_without_a_leading_sample_axis_are_batched_along_their_own_axis() -> None:
    model = stateful_model()
    specs = {spec.name: spec.batch_axis for spec in input_specs(model)}
    assert specs == {"x": 0, "state": 1, "sr": None}  # "batch" symbol: axis 1 of state; sr has none
    data = stateful_data(20, seed=0)
    batches = list(Batches(data, input_specs(model), 8, what="calibration"))
    assert [b["state"].shape for b in batches] == [(2, 8, 8), (2, 8, 8), (2, 4, 8)]
    np.testing.assert_array_equal(batches[2]["state"], data["state"][:, 16:20])  # exact: a slice, no arithmetic
    assert all(b["sr"].shape == () and b["sr"] == data["sr"] for b in batches)  # the same value every batch
    with pytest.raises(InvalidDataError, match=r"'state'.*dimension 0 must be 2"):
        Batches({**data, "state": data["state"][:1]}, input_specs(model), 8, what="calibration")
    with pytest.raises(InvalidDataError, match="disagree on the number of samples"):
        Batches({**data, "state": data["state"][:, :10]}, input_specs(model), 8, what="calibration")


def test_held_out_samples_are_the_last_part_along_each_input_s_own_axis() -> None:
    model = stateful_model()
    data = stateful_data(64, seed=0)
    fit, scored = Batches(data, input_specs(model), 8, what="calibration").held_out(0.5, 24, 8)
    assert (fit.num_samples, scored.num_samples) == (40, 24)  # half is 32, at most 24
    np.testing.assert_array_equal(next(iter(scored))["state"], data["state"][:, 40:48])  # exact: a slice
    np.testing.assert_array_equal(next(iter(fit))["x"], data["x"][:8])
    assert next(iter(scored))["sr"] == data["sr"]  # a constant input whole in both parts
    # too few for 8 samples in either part: nothing held out
    assert Batches(stateful_data(15, seed=0), input_specs(model), 8, what="calibration").held_out(0.5, 24, 8) is None


def test_stateful_model_calibrates_on_the_samples_of_every_input(tmp_path) -> None:
    model = stateful_model()
    data = stateful_data(20, seed=1)
    config = QuantizeConfig(observer="minmax", batch_size=8)
    prepared = prepare(model)
    annotation = annotate(prepared, config)
    assert {"x", "m"} <= set(annotation.activations)  # the two MatMul data operands
    calibrated = calibrate(prepared, annotation, data, config).configs
    # m over all 20 samples in one independent FP32 run: it mixes x with the state of the same sample, so a
    # misaligned state (or a scalar batched along some axis) changes max|m|
    session_model = onnx.ModelProto.FromString(model.SerializeToString())
    session_model.graph.output.extend([onnx.ValueInfoProto(name="m")])
    session = ort.InferenceSession(session_model.SerializeToString(), providers=["CPUExecutionProvider"])
    (m,) = session.run(["m"], data)
    # float32 scale of the float32 max of the same values: equal to 1 ulp
    assert calibrated["m"].scale == pytest.approx(np.abs(m).max() / 127, rel=1e-6)
    # and the whole public pipeline runs on it: export, exact-QDQ and deployed evaluation
    # the default recipe (percentile observer: the scalar sr, an operand of the Mul read by a MatMul, is
    # observed as a 0-d array each batch) with the CPU latency stage
    config = QuantizeConfig(batch_size=8)
    result = quantize(
        save(model, tmp_path / "stateful.onnx"), data, stateful_data(12, seed=2), config, tmp_path / "out"
    )
    evaluation = result.report["evaluation"]
    assert evaluation["num_samples"] == 12
    for mode in ("qdq_exact", "qdq_deployed"):
        # measured 21.3 dB on y: the states' per-sample magnitudes span 100x, so m's one int8 grid is
        # coarse for the small samples; the bound checks that the exported model computes the same function
        assert evaluation[mode]["outputs"]["y"]["sqnr_db"] > 15, mode


def nonzero_model() -> onnx.ModelProto:
    """input (N, 4) -> Relu -> "relu"; NonZero("relu") -> "where", whose shape depends on the data."""
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Relu", ["input"], ["relu"]),
            onnx.helper.make_node("NonZero", ["relu"], ["where"]),
        ],
        "nonzero",
        [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["N", 4])],
        [onnx.helper.make_tensor_value_info("where", onnx.TensorProto.INT64, [2, None])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_fetcher_reuses_its_buffers_and_reruns_when_a_shape_depends_on_the_data() -> None:
    model = nonzero_model()
    names = ["relu", "where"]
    exposed = onnx.ModelProto.FromString(model.SerializeToString())
    exposed.graph.output.append(onnx.ValueInfoProto(name="relu"))
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    fetch = ActivationFetcher(session, names)
    assert fetch.quiet.get_run_config_entry("gpu_graph_id") == "0"  # the default, found without an error raised
    rng = np.random.default_rng(3)
    first, same_count = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    same_count.flat[np.argsort(same_count.ravel())] = np.sort(first.ravel())  # same values (and NonZero count)
    fewer = np.minimum(first, -1.0)  # NonZero finds nothing: "where" becomes (2, 0), its buffer no longer fits
    smaller = rng.normal(size=(2, 4)).astype(np.float32)  # other input shape: new buffers
    arrays = None
    for x in (first, same_count, fewer, smaller, first):
        got = fetch({"input": x})
        if x is same_count:
            assert all(a is b for a, b in zip(got, arrays, strict=True))  # written in place, not reallocated
        arrays = list(got)
        expected = fp32_tensors(model, names, x)
        for name, value in zip(names, got, strict=True):
            # the same kernels on the same data: bit-identical to a plain session.run
            assert value.shape == expected[name].shape and np.array_equal(value, expected[name]), name


def test_threaded_and_inline_observation_give_the_same_scales(setup, monkeypatch) -> None:
    prepared, x = setup
    config = QuantizeConfig(observer="percentile", batch_size=7)
    annotation = annotate(prepared, config)
    results = []
    for threshold in (0, 1 << 62):  # every batch on the pool / every batch on the calling thread
        monkeypatch.setattr(calibration, "PARALLEL_OBSERVE_BYTES", threshold)
        results.append(calibrate(prepared, annotation, {"input": x}, config).configs)
    assert results[0].keys() == results[1].keys()
    for name, tqc in results[0].items():
        # each observer sees the same batches in the same order either way: bit-identical scales
        assert np.array_equal(tqc.scale, results[1][name].scale) and tqc.state is results[1][name].state, name


def test_a_percentile_left_below_its_floor_is_observed_again_fully(setup) -> None:
    prepared, _ = setup
    rng = np.random.default_rng(5)
    # a first batch of 64 samples (12288 values per tensor: the percentile observers set their floor),
    # then 80 batches 100 times smaller in magnitude: the 99.99th percentile falls below the floor
    x = rng.normal(size=(81 * 64, 3, 8, 8)).astype(np.float32)
    x[64:] *= 0.01
    config = QuantizeConfig(observer="percentile", batch_size=64)
    annotation = annotate(prepared, config)
    names = annotation.activations
    fast = {name: calibration.make_observer(annotation.configs[name], config) for name in names}
    full = {name: calibration.make_observer(annotation.configs[name], config, resolve_all=True) for name in names}
    for start in range(0, len(x), 64):  # the batches calibrate sees, computed by a plain session
        batch = x[start : start + 64]
        values = fp32_tensors(prepared.model, [n for n in names if n != "input"], batch)
        values["input"] = batch
        for name in names:
            fast[name].observe(values[name])
            full[name].observe(values[name])
    assert not fast["input"].complete  # the case under test: the first pass alone cannot answer
    calibrated = calibrate(prepared, annotation, {"input": x}, config).configs
    for name in names:
        scale, _ = scale_offset(annotation.configs[name], *full[name].bounds())
        assert np.array_equal(calibrated[name].scale, scale), name  # the fully resolved histogram's scale


@pytest.mark.parametrize("observer", ["minmax", "percentile"])
def test_batches_whose_observed_tensors_exceed_the_budget_are_split(setup, monkeypatch, observer: str) -> None:
    prepared, x = setup
    config = QuantizeConfig(observer=observer, batch_size=7)
    annotation = annotate(prepared, config)
    whole = calibrate(prepared, annotation, {"input": x}, config)
    assert not whole.notes  # a few KB a batch: nothing to split
    monkeypatch.setattr(calibration, "EXPOSED_BYTES_PER_BATCH", 1)  # less than one sample: batches of 1
    split = calibrate(prepared, annotation, {"input": x}, config)
    assert split.notes == ("calibration ran in batches of 1, not 7: a batch's observed tensors are kept under 0 MB",)
    # min and max do not depend on how the samples are batched, nor do the percentile's histograms, whose
    # bin edges are powers of two apart whatever the first batch held
    for name, tqc in whole.configs.items():
        assert np.array_equal(tqc.scale, split.configs[name].scale), name
    ema = QuantizeConfig(observer="ema_minmax", batch_size=7)  # an average over batches: never split
    assert not calibrate(prepared, annotate(prepared, ema), {"input": x}, ema).notes
