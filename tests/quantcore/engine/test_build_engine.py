"""build_engine: on this CPU-only machine it must say ``skipped`` and why, with the static checks and
metadata still filled in; options validate; the inspector parsing and the FP16 rewrite run anywhere.
GPU tests (marked ``gpu``) build and run real engines; they skip without CUDA and TensorRT."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import quantcore
from quantcore.runtime.batching import input_specs
from quantcore.tensorrt.build import tensorrt_module
from quantcore.tensorrt.engine import EngineOptions, EngineResult, build_engine, observed_shapes
from quantcore.tensorrt.layer_precision import int8_annotated_nodes, layer_table
from quantcore.tensorrt.metadata import cuda_status, file_sha256
from tests.quantcore.models import conv_bn_residual, save


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    directory = tmp_path_factory.mktemp("engine")
    model = conv_bn_residual()
    path = save(model, directory / "model.onnx")
    data = {"input": np.random.default_rng(0).normal(size=(40, 3, 8, 8)).astype(np.float32)}
    result = quantcore.quantize(path, data, data, quantcore.QuantizeConfig(), directory / "out")
    return path, result.model_path, data, directory


def _gpu_ready() -> None:
    """Skip honestly unless both TensorRT and a CUDA device are usable."""
    pytest.importorskip("tensorrt", reason="TensorRT is not installed on this machine")
    usable, reason = cuda_status()
    if not usable:
        pytest.skip(reason)


def test_skipped_without_cuda_or_tensorrt(exported) -> None:
    fp32, qdq, data, directory = exported
    usable, cuda_reason = cuda_status()
    trt, trt_reason = tensorrt_module()
    if usable and trt is not None:
        pytest.skip("this machine has CUDA and TensorRT; the skip path cannot be observed")
    before = set((directory / "out").iterdir())
    calls = []
    result = build_engine(
        qdq,
        directory / "out",
        calibration_shapes=observed_shapes(data, 16, input_specs(qdq)),
        fp32_model_path=fp32,
        evaluation=data,
        progress=lambda *call: calls.append(call),
    )
    assert result.status == "skipped"
    assert result.reason == "; ".join(r for r in (cuda_reason, trt_reason) if r)
    assert "CUDA" in result.reason or "TensorRT" in result.reason
    # Nothing measured, nothing written: a skip never fakes a result.
    assert result.engine_path is None and result.latency is None and result.comparison is None and not result.layers
    assert set((directory / "out").iterdir()) == before
    # What runs anywhere is still there: static checks, flags, profiles, the model's SHA-256.
    assert result.qdq_checks == {"errors": 0, "warnings": 0, "findings": []}
    metadata = result.metadata
    assert metadata["onnx_sha256"] == file_sha256(qdq)
    assert metadata["flags"]["strongly_typed"] is True and metadata["flags"]["precision_flags"] == []
    assert metadata["profiles"] == [{"input": {"min": [1, 3, 8, 8], "opt": [16, 3, 8, 8], "max": [32, 3, 8, 8]}}]
    document = result.to_dict()
    assert json.loads(json.dumps(document, allow_nan=False)) == document
    assert calls[0][:2] == ("engine", 0.0) and calls[-1][:2] == ("engine", 1.0)


def test_skip_reports_static_rule_violations(exported, tmp_path) -> None:
    _, qdq, _, _ = exported
    model = onnx.load(str(qdq))
    zero = next(t for t in model.graph.initializer if t.name == "r1_zero_point")
    zero.CopyFrom(onnx.numpy_helper.from_array(np.int8(5), "r1_zero_point"))
    broken = save(model, tmp_path / "broken.onnx")
    result = build_engine(broken, tmp_path, calibration_shapes={"input": [(8, 3, 8, 8)]})
    if result.status != "skipped":
        pytest.skip("this machine can build engines")
    assert result.qdq_checks["errors"] >= 1
    assert {f["rule"] for f in result.qdq_checks["findings"]} == {"zero_offset"}


def test_options_validate() -> None:
    with pytest.raises(ValueError, match="optimization_level"):
        EngineOptions(optimization_level=7)
    with pytest.raises(ValueError, match="hardware_compatibility"):
        EngineOptions(hardware_compatibility="turing_plus")
    with pytest.raises(ValueError, match="workspace_bytes"):
        EngineOptions(workspace_bytes=0)
    with pytest.raises(ValueError, match="reason"):
        EngineResult(status="skipped", reason=None)
    with pytest.raises(ValueError, match="status"):
        EngineResult(status="done", reason=None)


INSPECTOR = {
    "Layers": [
        {
            "Name": "input_QuantizeLinear",
            "LayerType": "Reformat",
            "Inputs": [{"Name": "input", "Format/Datatype": "Row major linear FP32"}],
            "Outputs": [{"Name": "q", "Format/Datatype": "Row major linear Int8"}],
        },
        {
            "Name": "conv1 + relu1",
            "LayerType": "CaskConvolution",
            "Inputs": [{"Name": "q", "Format/Datatype": "Thirty-two wide channel vectorized row major Int8 format"}],
            "Outputs": [{"Name": "r1", "Format/Datatype": "Channel major INT8 format where channel % 32 == 0"}],
            "Metadata": "[ONNX Layer: conv1]\u001f[ONNX Layer: relu1]",
        },
        {
            "Name": "conv2 + add",
            "LayerType": "CaskConvolution",
            "Inputs": [{"Name": "r1", "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
            "Outputs": [{"Name": "sum", "Format/Datatype": "Row major linear FP32"}],
        },
    ]
}


def test_layer_table_flags_int8_layers_run_in_higher_precision(exported) -> None:
    _, qdq, _, _ = exported
    annotated = int8_annotated_nodes(onnx.load(str(qdq)))
    assert annotated == ["conv1", "conv2", "fc"]
    layers, notes = layer_table(json.dumps(INSPECTOR), annotated)
    assert [layer["input_precision"] for layer in layers] == ["FP32", "INT8", "FP16"]
    assert layers[1]["onnx_nodes"] == ["conv1", "relu1"] and layers[1]["annotated_int8"]
    assert notes == [
        "conv2: annotated INT8 but TensorRT ran it in FP16",
        "fc: annotated INT8, not found among the engine's layers (renamed or fused away)",
    ]


@pytest.mark.gpu
def test_gpu_build_compare_and_time(exported, tmp_path) -> None:
    _gpu_ready()
    fp32, qdq, data, _ = exported
    cache_dir = tmp_path / "cache"
    result = build_engine(
        qdq,
        tmp_path,
        calibration_shapes=observed_shapes(data, 16, input_specs(qdq)),
        fp32_model_path=fp32,
        evaluation=data,
        timing_cache_dir=cache_dir,
        latency_runs=20,
        latency_warmup=5,
    )
    assert result.status == "built", (result.reason, result.errors)
    assert result.engine_path.is_file() and result.metadata_path.is_file()
    assert result.metadata["gpu"]["name"] and result.metadata["tensorrt_version"]
    assert result.metadata["timing_cache"]["saved_bytes"] > 0
    # The engine computes what the QDQ model computes: INT8 kernels accumulate in int32 and round
    # once per layer, like ONNX Runtime's exact Q/DQ up to kernel ordering; 30 dB is 3% noise.
    assert result.comparison["vs_qdq"]["logits"]["sqnr_db"] > 30
    for key in ("int8", "fp16"):
        for summary in result.latency[key].values():
            assert 0 < summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"]
    again = build_engine(
        qdq,
        tmp_path / "again",
        calibration_shapes=observed_shapes(data, 16, input_specs(qdq)),
        timing_cache_dir=cache_dir,
    )
    assert again.metadata["timing_cache"]["loaded_bytes"] > 0  # reused across builds


@pytest.mark.gpu
def test_gpu_parser_errors_are_verbatim(tmp_path) -> None:
    _gpu_ready()
    model = conv_bn_residual()
    model.graph.node[0].op_type = "NoSuchOp"
    path = save(model, tmp_path / "bad.onnx")
    result = build_engine(path, tmp_path, calibration_shapes={"input": [(4, 3, 8, 8)]})
    assert result.status == "failed" and "parser" in result.reason
    assert result.errors and any("NoSuchOp" in json.dumps(e) for e in result.errors)


def test_skip_still_reports_a_profile_problem(tmp_path) -> None:
    """A dynamic input without recipe profile or calibration shapes is said at once, even on CPU."""
    model = conv_bn_residual()
    path = save(model, tmp_path / "model.onnx")
    result = build_engine(path, tmp_path)
    if result.status != "skipped":
        pytest.skip("this machine can build engines")
    assert result.metadata["profiles"] is None
    assert "input" in result.metadata["profile_error"] and "calibration shapes" in result.metadata["profile_error"]


def test_metadata_hashes_external_data(tmp_path) -> None:
    model = conv_bn_residual()
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    result = build_engine(tmp_path / "m.onnx", tmp_path, calibration_shapes={"input": [(4, 3, 8, 8)]})
    assert result.metadata["onnx_sha256"] == file_sha256(tmp_path / "m.onnx")
    assert result.metadata["onnx_external_data"] == [{"path": "m.data", "sha256": file_sha256(tmp_path / "m.data")}]


def test_a_caller_known_skip_still_checks_and_round_trips(exported, tmp_path) -> None:
    # A service that knows no GPU worker exists says so; the static checks and profiles still run.
    _, qdq, data, _ = exported
    reason = "no GPU worker with TensorRT is registered"
    result = build_engine(
        qdq, tmp_path, calibration_shapes=observed_shapes(data, 16, input_specs(qdq)), skip_reason=reason
    )
    assert result.status == "skipped" and result.reason == reason
    assert result.qdq_checks == {"errors": 0, "warnings": 0, "findings": []}
    assert result.metadata["profiles"] and result.metadata["onnx_sha256"] == file_sha256(qdq)
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing written
    # A result written by another process (the engine worker) reads back to the same document.
    document = json.loads(json.dumps(result.to_dict()))
    assert EngineResult.from_dict(document).to_dict() == result.to_dict()
