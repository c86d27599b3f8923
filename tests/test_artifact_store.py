"""The artifacts a worker stores for a job (`worker.runner._store`)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from jobs import storage
from quantcore.pipeline import QuantizeResult
from worker import runner


class _Progress:
    def __init__(self) -> None:
        self.job_id = uuid.uuid4()
        self.events: list[tuple[str, float, str]] = []

    def __call__(self, stage: str, fraction: float, message: str) -> None:
        self.events.append((stage, fraction, message))


def _result(work: Path, *, data: bool) -> QuantizeResult:
    work.mkdir()
    for name in ("model.qdq.onnx", "tqc.json", "report.json", "report.html"):
        (work / name).write_bytes(name.encode())
    if data:
        (work / "model.qdq.onnx.data").write_bytes(b"\x00" * 4096)
    return QuantizeResult(
        model_path=work / "model.qdq.onnx",
        tqc_path=work / "tqc.json",
        report_path=work / "report.json",
        report={},
        model_data_path=work / "model.qdq.onnx.data" if data else None,
    )


@pytest.mark.parametrize("data", [False, True])
def test_a_model_beyond_2_gb_is_stored_with_its_weights_file_beside_it(tmp_path, monkeypatch, data) -> None:
    """The exported model references `model.qdq.onnx.data` by that name, in its own folder: without it a
    downloaded model beyond 2 GB does not load."""
    monkeypatch.setattr(runner.settings, "var_dir", tmp_path / "var")
    progress, project = _Progress(), uuid.uuid4()
    stored = runner._store(progress, project, _result(tmp_path / "work", data=data))
    names = {artifact["name"]: artifact for artifact in stored}
    assert ("model.qdq.onnx.data" in names) is data
    assert {"model.qdq.onnx", "tqc.json", "report.json", "report.html"} <= set(names)
    model = storage.resolve(runner.settings.artifact_root, names["model.qdq.onnx"]["path"])
    if data:
        weights = storage.resolve(runner.settings.artifact_root, names["model.qdq.onnx.data"]["path"])
        assert weights == model.with_name("model.qdq.onnx.data") and weights.read_bytes() == b"\x00" * 4096
        assert names["model.qdq.onnx.data"]["size_bytes"] == 4096
    assert progress.events[-1] == ("store", 1.0, f"stored {len(stored)} artifacts")
