"""The onnxruntime platform measured beside a tensorrt model no engine was built for
(quantcore.pipeline.cpu_alternative): real quantization, evaluation and timings of a tiny model; the
tests check that the figures were measured, never which model is faster."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from jobs.report_schema import Report
from quantcore import QuantizeConfig, quantize
from quantcore.config import AnalysisOptions
from quantcore.evaluate.paired_latency import Timing, conclusive
from quantcore.tensorrt.engine import EngineResult, build_engine
from tests.quantcore.models import save
from tests.quantcore.placement_cases import two_regions
from tests.test_report_schema import undocumented

# tensorrt with an engine stage, nothing else slow; batch sizes 1 and 4 keep the timings short
CONFIG = {
    "platform": "tensorrt",
    "tensorrt_engine": True,
    "percentile_candidates": (),
    "analysis": AnalysisOptions(enabled=False),
    "cpu_latency": False,
    "cpu_threads": 1,
    "cpu_batch_sizes": (1, 4),
}


@pytest.fixture
def run(tmp_path):
    data = np.random.default_rng(1).normal(size=(32, 3, 8, 8)).astype(np.float32)
    path = save(two_regions(), tmp_path / "model.onnx")

    def quantized(config: QuantizeConfig, engine_builder=build_engine):
        return quantize(
            path, {"input": data}, {"input": data[:8]}, config, tmp_path / "out", engine_builder=engine_builder
        )

    return quantized


def test_a_skipped_engine_gets_the_onnxruntime_platform_measured_beside_it(run, tmp_path) -> None:
    result = run(QuantizeConfig(**CONFIG, cpu_alternative=True))  # no TensorRT here: the engine stage skips
    assert result.report["engine"]["status"] == "skipped"
    section = result.report["latency"]["cpu_alternative"]
    assert section["platform"] == "onnxruntime" and section["threads"] == 1 and section["batch_sizes"] == [1, 4]
    fp32 = {b: Timing.from_dict(section["timings"][f"batch_{b}"]["fp32"]) for b in (1, 4)}
    for label in ("default", "onnxruntime"):
        # enough runs of each for a verdict: MIN_RUNS, or fewer where the protocol stopped on runs far apart
        assert conclusive({b: Timing.from_dict(section["timings"][f"batch_{b}"][label]) for b in (1, 4)}, fp32)
    for batch in ("batch_1", "batch_4"):
        timings = section["timings"][batch]
        assert all(timings[label]["p50_ms"] > 0 for label in timings)
        for label in ("default", "onnxruntime"):
            assert section["speedup_p50"][label][batch] == pytest.approx(
                timings["fp32"]["p50_ms"] / timings[label]["p50_ms"],
                rel=1e-12,  # the same floats divided
            )
    assert section["output"] == "out"
    assert section["cosine"]["default"] == result.report["evaluation"]["qdq_deployed"]["outputs"]["out"]["cosine"]
    assert 0.9 < section["cosine"]["onnxruntime"] <= 1.0 + 1e-9  # int8 of a tiny conv net: near, never above 1
    assert "cpu_alternative" in result.report["stage_seconds"]
    assert undocumented(Report.model_validate(result.report)) == []
    exported = onnx.load(str(result.model_path))  # the files are the tensorrt model's: the alternative is measured only
    assert result.report["config"]["platform"] == "tensorrt" and exported.graph.node
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".onnx") == ["model.qdq.onnx"]


def test_nothing_is_measured_with_an_engine_or_unasked(run) -> None:
    def built(qdq_model_path, out_dir, **_):
        return EngineResult(status="built", reason=None)

    assert (
        run(QuantizeConfig(**CONFIG, cpu_alternative=True), engine_builder=built).report["latency"]["cpu_alternative"]
        is None
    )
    assert run(QuantizeConfig(**CONFIG)).report["latency"]["cpu_alternative"] is None
