"""`jobs download`: temp file then rename, Range resume of a `.part`, checksum refusal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cli.quantctl import main

NAME = "model.qdq.onnx"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def job(api) -> str:
    api.add_job("job-1", "succeeded")
    return "job-1"


def test_download_all_artifacts_into_the_directory(api, job: str, tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "jobs", "download", job, "-o", str(tmp_path))
    assert code == 0
    assert out.splitlines() == [str(tmp_path / name) for name in api.artifacts]
    for name, data in api.artifacts.items():
        assert (tmp_path / name).read_bytes() == data
    assert not list(tmp_path.glob("*.part"))
    assert api.ranges == [None, None]


def test_download_resumes_a_partial_file_with_range(api, job: str, tmp_path: Path, capsys) -> None:
    data = api.artifacts[NAME]
    (tmp_path / f"{NAME}.part").write_bytes(data[:100_000])
    code, _, _ = run(capsys, "jobs", "download", job, "--name", NAME, "-o", str(tmp_path))
    assert code == 0
    assert api.ranges == ["bytes=100000-"]
    assert (tmp_path / NAME).read_bytes() == data
    assert not (tmp_path / f"{NAME}.part").exists()


def test_download_restarts_when_the_server_ignores_range(api, job: str, tmp_path: Path, capsys) -> None:
    api.ignore_range = True
    data = api.artifacts[NAME]
    (tmp_path / f"{NAME}.part").write_bytes(b"\xff" * 5000)  # wrong bytes: must be overwritten, not appended to
    code, _, _ = run(capsys, "jobs", "download", job, "--name", NAME, "-o", str(tmp_path))
    assert code == 0
    assert (tmp_path / NAME).read_bytes() == data


def test_a_complete_part_file_is_finished_without_refetching(api, job: str, tmp_path: Path, capsys) -> None:
    data = api.artifacts[NAME]
    (tmp_path / f"{NAME}.part").write_bytes(data)
    code, _, _ = run(capsys, "jobs", "download", job, "--name", NAME, "-o", str(tmp_path))
    assert code == 0
    assert api.ranges == [f"bytes={len(data)}-"]  # answered 416: nothing left to send
    assert (tmp_path / NAME).read_bytes() == data


def test_a_corrupt_part_is_refused_and_removed(api, job: str, tmp_path: Path, capsys) -> None:
    data = api.artifacts[NAME]
    (tmp_path / f"{NAME}.part").write_bytes(b"\x00" * 1000)  # right length prefix, wrong bytes
    code, _, err = run(capsys, "jobs", "download", job, "--name", NAME, "-o", str(tmp_path))
    assert code == 1
    assert "does not match the announced" in err
    assert not (tmp_path / NAME).exists() and not (tmp_path / f"{NAME}.part").exists()
    # The next attempt starts from zero and succeeds.
    assert run(capsys, "jobs", "download", job, "--name", NAME, "-o", str(tmp_path))[0] == 0
    assert hashlib.sha256((tmp_path / NAME).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()


def test_an_up_to_date_file_is_not_downloaded_again(api, job: str, tmp_path: Path, capsys) -> None:
    (tmp_path / NAME).write_bytes(api.artifacts[NAME])
    code, _, err = run(capsys, "jobs", "download", job, "--name", NAME, "-o", str(tmp_path))
    assert code == 0
    assert "already up to date" in err
    assert api.ranges == []


def test_unknown_artifact_name_is_a_usage_error(api, job: str, tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "jobs", "download", job, "--name", "engine.plan", "-o", str(tmp_path))
    assert code == 2
    assert "no artifact engine.plan" in err and NAME in err


def test_default_directory_is_the_job_id(api, job: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, _ = run(capsys, "jobs", "download", job, "--name", "tqc.json")
    assert code == 0
    assert (tmp_path / job / "tqc.json").read_bytes() == api.artifacts["tqc.json"]
