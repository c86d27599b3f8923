"""The report schema (jobs/report_schema.py) against real reports written by quantcore: every report
validates, and the schema documents every field quantcore writes (none falls into ``extra``)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from pydantic import BaseModel

from jobs.report_schema import Report
from quantcore import QuantizeConfig, quantize
from quantcore.config import AccuracyTarget
from tests.quantcore.models import planted_outlier, save


def undocumented(model: BaseModel, path: str = "report") -> list[str]:
    """Dotted paths of fields present in the data but not declared by the schema."""
    found = [f"{path}.{key}" for key in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            found += undocumented(value, f"{path}.{name}")
        elif isinstance(value, (list, dict)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            found += [
                p
                for key, item in items
                if isinstance(item, BaseModel)
                for p in undocumented(item, f"{path}.{name}[{key}]")
            ]
    return found


@pytest.mark.parametrize("cpu_latency", [True, False])
def test_real_report_validates_and_is_fully_documented(tmp_path, cpu_latency: bool) -> None:
    path = save(planted_outlier(), tmp_path / "planted.onnx")
    data = np.random.default_rng(1).normal(size=(64, 3, 8, 8)).astype(np.float32)
    labels = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": data[48:]})[0].argmax(1)
    config = QuantizeConfig(platform="tensorrt", cpu_latency=cpu_latency, target=AccuracyTarget("cosine", 0.999))
    result = quantize(path, {"input": data[:48]}, {"input": data[48:]}, config, tmp_path / "out", labels=labels)
    report = Report.model_validate(result.report)
    assert undocumented(report) == []
    assert report.target is not None and report.target.met and report.analysis is not None
    assert (report.latency.cpu is not None) == cpu_latency


def test_report_schema_is_in_the_openapi_document() -> None:
    from api.main import create_app

    document = create_app().openapi()
    operation = document["paths"]["/api/v1/jobs/{job_id}/report"]["get"]
    reference = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert reference.endswith("/Report")
    schemas = document["components"]["schemas"]
    assert {"LayerHarm", "TensorStats", "TargetOutcome", "TargetStep", "OutputMetrics"} <= set(schemas)


def test_a_reconstruction_report_is_fully_documented(tmp_path) -> None:
    from quantcore import ReconstructionConfig

    path = save(planted_outlier(), tmp_path / "planted.onnx")
    data = np.random.default_rng(2).normal(size=(40, 3, 8, 8)).astype(np.float32)
    config = QuantizeConfig(
        platform="academic",
        precision="w4a8",
        cpu_latency=False,
        reconstruction=ReconstructionConfig(method="qdrop", iters=20, batch_size=8, num_samples=32, threads=1),
    )
    result = quantize(path, {"input": data[:32]}, {"input": data[32:]}, config, tmp_path / "out")
    report = Report.model_validate(result.report)
    assert undocumented(report) == []
    assert report.reconstruction is not None and report.reconstruction.blocks
    assert report.config.reconstruction is not None and report.config.reconstruction.method == "qdrop"


def test_an_auto_report_is_fully_documented(tmp_path) -> None:
    from quantcore import AutoOptions, quantize_auto

    path = save(planted_outlier(), tmp_path / "planted.onnx")
    data = np.random.default_rng(1).normal(size=(64, 3, 8, 8)).astype(np.float32)
    auto = AutoOptions(objective=AccuracyTarget("cosine", 0.99999999), candidates=("minmax",))  # falls back
    config = QuantizeConfig(platform="tensorrt", strategy="auto", auto=auto)
    result = quantize_auto(path, {"input": data[:48]}, {"input": data[48:]}, config, tmp_path / "out")
    report = Report.model_validate(result.report)
    assert undocumented(report) == []
    assert report.auto is not None and report.auto.fallback is not None
    assert report.auto.candidates[0].latency_p50_ms is not None


@pytest.mark.parametrize("rewrite", ["equalization", "smoothquant"])
def test_the_function_preserving_rewrites_are_fully_documented(tmp_path, rewrite: str) -> None:
    """One at a time: equalized, the model's outlier channel is gone and SmoothQuant has no group to smooth."""
    from tests.quantcore.test_smoothquant import _convolutions, _images

    path = save(_convolutions(0), tmp_path / "convolutions.onnx")
    config = QuantizeConfig(platform="onnxruntime", cpu_latency=False, **{rewrite: True})
    result = quantize(path, {"x": _images(2, 64)}, {"x": _images(3, 16)}, config, tmp_path / "out")
    report = Report.model_validate(result.report)
    assert undocumented(report) == []
    if rewrite == "equalization":
        assert report.prepare.equalization is not None and report.prepare.equalization.pairs
        assert report.prepare.smoothquant is None
    else:
        assert report.prepare.smoothquant is not None and report.prepare.smoothquant.smoothed
        assert report.prepare.smoothquant.held_out and "unsmoothed" in report.prepare.smoothquant.scores_db
        assert report.prepare.equalization is None
