"""The artifacts a worker stores for a job (`worker.runner._store`): staged in the store, named by the
keys the job's end moves them to (`tests/test_storage.py` covers the move and a crash before it)."""

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
        self.attempt = 1
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
    monkeypatch.setattr(runner.settings, "storage_url", None)
    progress, project = _Progress(), uuid.uuid4()
    stored = runner._store(progress, project, _result(tmp_path / "work", data=data))
    names = {artifact["name"]: artifact for artifact in stored}
    assert ("model.qdq.onnx.data" in names) is data
    assert {"model.qdq.onnx", "tqc.json", "report.json", "report.html"} <= set(names)
    root = runner.settings.artifact_root
    model = storage.resolve(root, names["model.qdq.onnx"]["path"])
    if data:
        weights = storage.resolve(root, names["model.qdq.onnx.data"]["path"])
        assert weights == model.with_name("model.qdq.onnx.data")
        staged = storage.resolve(root, storage.staging_key(project, progress.job_id, 1, "model.qdq.onnx.data"))
        assert staged.read_bytes() == b"\x00" * 4096
        assert names["model.qdq.onnx.data"]["size_bytes"] == 4096
    assert progress.events[-1] == ("store", 1.0, f"stored {len(stored)} artifacts")
