"""The zoo through stage 7: every model the tensorrt platform exports passes the static TensorRT rules
(CPU), and, on a GPU worker, builds into an engine whose outputs match the QDQ simulation."""

from __future__ import annotations

import onnx
import pytest

from quantcore import QuantizeConfig, quantize
from quantcore.runtime.batching import input_specs
from quantcore.tensorrt.engine import build_engine, check_qdq, observed_shapes
from quantcore.tensorrt.metadata import cuda_status
from samples.zoo import ZOO, build

CALIBRATION = 16  # of the zoo's 24 samples; the rest evaluate


@pytest.fixture(scope="module", params=ZOO)
def zoo_export(request, tmp_path_factory):
    zoo = build(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    path = directory / "model.onnx"
    onnx.save(zoo.model, path)
    calibration = {k: v[:CALIBRATION] for k, v in zoo.inputs.items()}
    evaluation = {k: v[CALIBRATION:] for k, v in zoo.inputs.items()}
    result = quantize(path, calibration, evaluation, QuantizeConfig(platform="tensorrt"), directory / "out")
    return request.param, path, result.model_path, calibration, evaluation, directory


def test_zoo_exports_follow_tensorrt_rules(zoo_export) -> None:
    name, _, qdq, *_ = zoo_export
    findings = [f.to_dict() for f in check_qdq(qdq)]
    assert findings == [], name


@pytest.mark.gpu
def test_zoo_engine_matches_the_simulation(zoo_export) -> None:
    pytest.importorskip("tensorrt", reason="TensorRT is not installed on this machine")
    usable, reason = cuda_status()
    if not usable:
        pytest.skip(reason)
    name, fp32, qdq, calibration, evaluation, directory = zoo_export
    result = build_engine(
        qdq,
        directory / "engine",
        calibration_shapes=observed_shapes(calibration, 8, input_specs(qdq)),
        fp32_model_path=fp32,
        evaluation=evaluation,
        latency_runs=20,
        latency_warmup=5,
    )
    assert result.status == "built", (name, result.reason, result.errors)
    for output, metrics in result.comparison["vs_qdq"].items():
        # Same integer arithmetic up to accumulation order and TensorRT's fused epilogues: well above
        # the ~20-40 dB the quantization itself costs against FP32.
        assert metrics["sqnr_db"] is None or metrics["sqnr_db"] > 25, (name, output, metrics)
