"""Data that the model does not run on, and models that do not run on one sample: the error names the
data, not quantcore, when the model as given fails on it too; a model whose batch axis is time (it
convolves over it, so one sample alone is too short) is calibrated, analysed and timed in whole batches."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantcore import InvalidDataError, QuantizeConfig, prepare, quantize
from quantcore.prepare import preparation
from tests.quantcore.test_robustness import _model, _value

RNG = np.random.default_rng(0)


def _init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.normal(0, 0.3, shape).astype(np.float32), name)


def _fixed_width_model() -> onnx.ModelProto:
    """x (N, "F") declared, but a (3,) scale fixes F at 3 (madmom's onset CNN declares every dimension of
    its input symbolic; its batch norm's scale fixes one); then a Gemm so there is something to quantize."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["scaled"], name="bn_mul"),
        helper.make_node("Gemm", ["scaled", "w"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, [_value("x", ["N", "F"])], [_value("y", ["N", 2])], [_init("scale", (3,)), _init("w", (2, 3))])


def test_data_the_model_cannot_run_on_is_the_data_s_error_before_any_slow_stage(tmp_path) -> None:
    model = _fixed_width_model()
    assert prepare(model, sample={"x": np.ones((2, 3), np.float32)}).warnings == ()  # data that fits
    with pytest.raises(InvalidDataError) as raised:
        prepare(model, sample={"x": np.ones((2, 5), np.float32)})
    message = str(raised.value)
    assert message.startswith("the data does not fit the model: ONNX Runtime fails to run the model as given")
    assert "('x' float32 (2, 5)): Mul node 'bn_mul': " in message  # the data, the node, ONNX Runtime's reason
    assert "onnxruntime_src" not in message and "[ONNXRuntimeError]" not in message  # its wrapping dropped
    onnx.save(model, tmp_path / "fixed.onnx")
    stages: list[str] = []
    data = {"x": np.ones((16, 5), np.float32)}
    with pytest.raises(InvalidDataError, match="the data does not fit the model"):
        quantize(
            tmp_path / "fixed.onnx",
            data,
            data,
            QuantizeConfig(),
            tmp_path / "out",
            progress=lambda stage, _f, _m: stages.append(stage),
        )
    assert set(stages) == {"prepare"}


def test_a_prepared_model_failing_where_the_model_as_given_runs_is_not_blamed_on_the_data(monkeypatch) -> None:
    """Should a rewrite of prepare break a model, the data that runs the original is not the user's fault:
    prepare goes on with the warning (the job then fails as an internal error, naming the stage)."""
    real = preparation.runtime_outputs

    def broken(model, sample, shapes_of=()):
        model.graph.node[0].op_type = "Sub"  # any rewrite ONNX Runtime then fails on: Sub by a (4,) tensor
        model.graph.initializer[0].CopyFrom(_init("scale", (4,)))
        return real(model, sample, shapes_of)

    monkeypatch.setattr(preparation, "runtime_outputs", broken)
    prepared = prepare(_fixed_width_model(), sample={"x": np.ones((2, 3), np.float32)})
    assert any("the prepared model did not run on the sample: " in w for w in prepared.warnings)


def _frames_model() -> onnx.ModelProto:
    """x (frames, 4) → a Conv of kernel 3 over the frames: its axis 0 is time, and fewer than 3 frames
    do not run."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["bands_first"], name="to_channels", perm=[1, 0]),
        helper.make_node("Unsqueeze", ["bands_first", "axis0"], ["seq"], name="add_batch"),
        helper.make_node("Conv", ["seq", "w"], ["conv"], name="conv_time"),
        helper.make_node("Relu", ["conv"], ["y"], name="relu"),
    ]
    initializers = [_init("w", (6, 4, 3)), numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    return _model(nodes, [_value("x", ["frames", 4])], [_value("y", [1, 6, "out"])], initializers)


def test_a_model_whose_batch_axis_is_time_quantizes_though_one_sample_cannot_run(tmp_path) -> None:
    """madmom's onset CNN takes (frames, bands, 3) and convolves over the frames: its axis 0 is time. One
    sample alone is too short for the kernel, so calibration sizes its batches and the analysis prices its
    runs on the first batch, and the latency stage leaves batch 1 out (was: the job failed in calibrate,
    then in latency; the analysis failed)."""
    onnx.save(_frames_model(), tmp_path / "frames.onnx")
    data = RNG.normal(0, 1, (64, 4)).astype(np.float32)
    result = quantize(
        tmp_path / "frames.onnx", {"x": data}, {"x": data[:32]}, QuantizeConfig(batch_size=32), tmp_path / "out"
    )
    decisions = {row["node"]: row["decision"] for row in result.report["annotation"]["decisions"]}
    assert decisions["conv_time"] == "quantized"
    assert [row["node"] for row in result.report["analysis"]["layers"] if row["analyzed"]] == ["conv_time"]
    assert not result.report["warnings"]
    cpu = result.report["latency"]["cpu"]
    assert cpu["batch_sizes"] == [32] and set(cpu["fp32"]) == {"batch_32"}
    note = "not measured at batch 1: the FP32 model does not run on it (FusedConv node 'conv_time': Invalid input"
    assert any(n.startswith(note) for n in cpu["notes"])
    # int8 on one Conv of random weights and data: about 40 dB; 30 says it was quantized and runs right
    assert 30 < result.report["evaluation"]["qdq_deployed"]["outputs"]["y"]["sqnr_db"] < 100


def test_evaluation_data_the_fp32_model_cannot_run_on_is_the_data_s_error_naming_the_samples(tmp_path) -> None:
    onnx.save(_frames_model(), tmp_path / "frames.onnx")
    data = RNG.normal(0, 1, (64, 4)).astype(np.float32)
    short_tail = {"x": data[:34]}  # batches of 32: the second holds 2 frames, fewer than the kernel's 3
    expected = (
        r"^evaluation data: the FP32 model does not run on samples 32 to 33 \('x' float32 \(2, 4\)\): .*'conv_time'"
    )
    with pytest.raises(InvalidDataError, match=expected):
        quantize(tmp_path / "frames.onnx", {"x": data}, short_tail, QuantizeConfig(batch_size=32), tmp_path / "out")
