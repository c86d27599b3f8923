"""Models whose outputs are not plain finite float tensors, as converters and real heads emit them: a
scikit-learn classifier converted by skl2onnx (string class labels, a ZipMap of class probabilities) and
a log head whose FP32 output is -inf where its input is 0."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import to_onnx
from sklearn.datasets import load_digits
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from quantcore import PLATFORMS, AnalysisOptions, QuantizeConfig, quantize
from quantcore.config import WEIGHT_ONLY_PLATFORM


@pytest.fixture(scope="module")
def sklearn_classifier(tmp_path_factory):
    """An MLP (64-64-32-10) trained on 1200 digits with the letters a-j as its classes, converted with
    skl2onnx's defaults: outputs ``output_label`` (strings) and ``output_probability`` (a ZipMap)."""
    images, digits = load_digits(return_X_y=True)
    images = images.astype(np.float32)
    names = np.array(list("abcdefghij"))[digits]
    classifier = make_pipeline(StandardScaler(), MLPClassifier((64, 32), max_iter=300, random_state=0))
    classifier.fit(images[:1200], names[:1200])
    path = tmp_path_factory.mktemp("sklearn") / "mlp.onnx"
    onnx.save(to_onnx(classifier, images[:1]), path)
    return path, images, digits


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_a_converted_sklearn_classifier_is_quantized_and_scored_on_its_labels(
    sklearn_classifier, platform, tmp_path
) -> None:
    path, images, digits = sklearn_classifier
    model = onnx.load(path)
    assert {o.name: o.type.WhichOneof("value") for o in model.graph.output} == {
        "output_label": "tensor_type",
        "output_probability": "sequence_type",
    }
    config = QuantizeConfig(platform=platform, cpu_latency=False, analysis=AnalysisOptions(max_layers=2))
    # 256 calibration samples: enough for the clip search, which runs both outputs
    result = quantize(path, {"X": images[:256]}, {"X": images[1200:]}, config, tmp_path, labels=digits[1200:])
    exported = onnx.load(result.model_path)
    onnx.checker.check_model(exported)
    assert [o.name for o in exported.graph.output] == ["output_label", "output_probability"]
    # weight-only: no quantizer node, its weights go into MatMulNBits
    quantizers = ("MatMulNBits",) if platform == WEIGHT_ONLY_PLATFORM else ("QuantizeLinear", "DynamicQuantizeLinear")
    assert any(n.op_type in quantizers for n in exported.graph.node)

    evaluation = result.report["evaluation"]
    fp32_top1 = evaluation["fp32"]["top1"]  # scored on the ZipMap's probabilities, classes in label order
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    predicted = session.run(["output_label"], {"X": images[1200:]})[0]
    assert fp32_top1 == pytest.approx(np.mean(predicted == np.array(list("abcdefghij"))[digits[1200:]]))
    for mode in ("qdq_exact", "qdq_deployed"):
        labels, probabilities = (evaluation[mode]["outputs"][n] for n in ("output_label", "output_probability"))
        assert labels["comparison"] == "equality" and labels["sqnr_db"] is None
        assert probabilities["comparison"] == "numeric" and probabilities["nonfinite"] == 0
        # a label flips only where a probability's argmax does: the two measure the same rows
        assert labels["exact_match"] == pytest.approx(probabilities["argmax_agreement"])
        # 8-bit: at most 2 of the 597 held-out digits change class (measured 0.992-1.0 across the presets);
        # the weight-only default, 4-bit weights in blocks of 32: 7 (measured 0.988)
        flips = 10 if platform == WEIGHT_ONLY_PLATFORM else 5
        assert labels["exact_match"] >= 1 - flips / 597
        assert evaluation[mode]["top1"] >= fp32_top1 - flips / 597
    assert result.report["parity"]["agree"] is not False
    if platform == WEIGHT_ONLY_PLATFORM:  # no Q/DQ tensor for the layer-wise analysis to measure: not run
        assert result.report["analysis"] is None
        return
    layerwise = [row for row in result.report["analysis"]["layers"] if row["analyzed"]]
    assert layerwise and all(row["sqnr_db"] is not None for row in layerwise)


def log_head() -> onnx.ModelProto:
    """x (N, 4) → MatMul (identity) → Relu → Log: -inf wherever x <= 0, in FP32 as in any quantization that
    keeps 0 exact (every preset's does)."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
            helper.make_node("Relu", ["y"], ["r"], name="relu"),
            helper.make_node("Log", ["r"], ["log"], name="log"),
        ],
        "log_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("log", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_output_fp32_makes_infinite_is_measured_where_it_is_finite(tmp_path) -> None:
    onnx.save(log_head(), tmp_path / "log.onnx")
    rng = np.random.default_rng(0)
    # a quarter of the values -1 (log: -inf), the rest in [0.5, 2]: far from 0 at 8 bits
    x = np.where(rng.random((64, 4)) < 0.25, -1.0, rng.uniform(0.5, 2.0, (64, 4))).astype(np.float32)
    config = QuantizeConfig(platform="onnxruntime", cpu_latency=False, analysis=AnalysisOptions(enabled=False))
    result = quantize(tmp_path / "log.onnx", {"x": x[:32]}, {"x": x[32:]}, config, tmp_path / "out")
    evaluation = result.report["evaluation"]
    with np.errstate(divide="ignore"):
        finite = np.isfinite(np.log(np.maximum(x[32:], 0)))
    assert 0 < finite.mean() < 1
    exact = evaluation["qdq_exact"]["outputs"]["log"]
    # the -inf are reproduced, so they agree, and the SQNR is that of the finite values: an 8-bit log of
    # values in [0.5, 2] (steps of about 2/255 before the log) is far above 30 dB
    assert exact["nonfinite"] == 0 and exact["sqnr_db"] is not None and exact["sqnr_db"] > 30
    assert exact["exact_match"] >= 1 - finite.mean()  # at least every -inf matched
    assert result.report["parity"]["agree"] is True
