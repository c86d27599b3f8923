"""Resuming from the checkpoint written after export: calibrate and export are skipped only when the
checkpoint matches the inputs and its files are intact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from quantcore import QuantizeConfig, quantize
from quantcore.export import checkpoint
from quantcore.export.checkpoint import CHECKPOINT_FILE
from tests.quantcore.models import conv_relu_gemm, save


@pytest.fixture
def first_run(tmp_path):
    path = save(conv_relu_gemm(), tmp_path / "m.onnx")
    data = np.random.default_rng(0).normal(size=(80, 2, 6, 6)).astype(np.float32)  # enough to choose a percentile
    out = tmp_path / "out"
    result = quantize(path, {"input": data}, {"input": data}, QuantizeConfig(batch_size=8), out)
    return path, data, out, result


def _stages_run(path, data, out, config, resume_from) -> tuple[list[str], dict]:
    calls: list[str] = []
    result = quantize(
        path,
        {"input": data},
        {"input": data},
        config,
        out,
        progress=lambda stage, fraction, message: calls.append(stage),
        resume_from=resume_from,
    )
    return list(dict.fromkeys(calls)), result.report


def test_checkpoint_lists_the_exported_files(first_run) -> None:
    path, data, out, result = first_run
    document = json.loads((out / CHECKPOINT_FILE).read_text())
    assert document["stage"] == "export"
    assert set(document["files"]) == {"model.qdq.onnx", "tqc.json"}
    assert result.report["resumed"] == []
    # the calibrate stage's seconds, which a resumed job's place stage budgets its timing runs by
    key = checkpoint.fingerprint(path, {"input": data}, QuantizeConfig(batch_size=8))
    restored = checkpoint.load(out, out, key)
    assert restored is not None and restored.calibration_seconds == result.report["stage_seconds"]["calibrate"] > 0


def test_resume_skips_calibrate_and_export_and_gives_the_same_model(first_run, tmp_path) -> None:
    path, data, out, first = first_run
    before = first.model_path.read_bytes()
    stages, report = _stages_run(path, data, out, QuantizeConfig(batch_size=8), resume_from=out)
    assert "calibrate" not in stages and "clip" not in stages and "export" not in stages, stages
    assert stages[:2] == ["prepare", "annotate"] and "evaluate" in stages
    assert report["resumed"] == ["calibrate", "clip", "export"]
    assert first.model_path.read_bytes() == before
    # the percentile the first run chose is the one the resumed run goes on with, and reports
    search = first.report["calibration"]["percentile_search"]
    assert search["chosen"] != 99.99  # not the configured one (99.999 here): the config shows the choice
    assert report["config"]["percentile"] == first.report["config"]["percentile"] == search["chosen"]
    assert report["calibration"]["percentile_search"] == search
    # Same files, so the same accuracy figures: exactly equal, not within a tolerance (timings differ).
    for key in ("fp32", "qdq_exact", "qdq_deployed"):
        assert report["evaluation"][key] == first.report["evaluation"][key]


def test_resume_into_another_directory_copies_the_files(first_run, tmp_path) -> None:
    path, data, out, first = first_run
    other = tmp_path / "other"
    _, report = _stages_run(path, data, other, QuantizeConfig(batch_size=8), resume_from=out)
    assert report["resumed"] == ["calibrate", "clip", "export"]
    assert (other / "model.qdq.onnx").read_bytes() == first.model_path.read_bytes()


@pytest.mark.parametrize("change", ["config", "data", "corrupt-file", "missing-file"])
def test_a_checkpoint_that_does_not_match_is_recomputed(first_run, change: str) -> None:
    path, data, out, _ = first_run
    config = QuantizeConfig(batch_size=8)
    if change == "config":
        config = QuantizeConfig(batch_size=8, observer="minmax")
    elif change == "data":
        data = data.copy()
        data[0, 0, 0, 0] += 1.0
    elif change == "corrupt-file":
        (out / "tqc.json").write_text("{}")
    else:
        (out / "model.qdq.onnx").unlink()
    stages, report = _stages_run(path, data, out, config, resume_from=out)
    assert "calibrate" in stages and "export" in stages
    assert report["resumed"] == []
