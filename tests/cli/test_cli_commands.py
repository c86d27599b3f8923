"""quantctl against the fake API: models, datasets, jobs, pagination, problem+json errors, usage."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from cli.quantctl import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def model_file(api, tmp_path: Path) -> Path:
    path = tmp_path / "net.onnx"
    path.write_bytes(api.model_bytes)
    return path


def test_models_upload_streams_the_file_and_waits_for_validation(api, model_file: Path, capsys) -> None:
    code, out, _ = run(capsys, "models", "upload", str(model_file))
    assert code == 0
    model = json.loads(out)
    assert model["status"] == "ready"  # the first answer was 202 pending; the CLI polled GET /models/{id}
    (upload,) = api.uploads
    assert upload["filename"] == "net.onnx"
    assert upload["size"] == len(api.model_bytes)
    # A Content-Length header means the multipart body was sized from the file, not chunked from memory.
    assert upload["content_length"] is not None and int(upload["content_length"]) > len(api.model_bytes)


def test_a_model_with_its_external_data_beside_it_goes_up_as_one_zip(api, model_file: Path, capsys) -> None:
    # what torch.onnx.export(model, x, "net.onnx", dynamo=True) leaves: net.onnx and net.onnx.data
    weights = bytes(range(7, 250)) * 50
    model_file.with_name("net.onnx.data").write_bytes(weights)
    code, out, err = run(capsys, "models", "upload", str(model_file))
    assert code == 0 and json.loads(out)["status"] == "ready"
    assert "net.onnx keeps its weights in net.onnx.data: uploading both, as one zip" in err
    (upload,) = api.uploads
    assert upload["filename"] == "net.onnx"
    with zipfile.ZipFile(io.BytesIO(upload["data"])) as archive:
        assert {name: archive.read(name) for name in archive.namelist()} == {
            "net.onnx": api.model_bytes,
            "net.onnx.data": weights,
        }


def test_models_upload_invalid_model_exits_1(api, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    code, out, err = run(capsys, "models", "upload", str(bad))
    assert code == 1
    assert json.loads(out)["status"] == "invalid"
    assert "is invalid: not an ONNX protobuf" in err


def test_models_upload_no_wait_prints_pending(api, model_file: Path, capsys) -> None:
    code, out, _ = run(capsys, "models", "upload", str(model_file), "--no-wait")
    assert (code, json.loads(out)["status"]) == (0, "pending")


def test_datasets_upload_and_missing_dataset_problem(api, tmp_path: Path, capsys) -> None:
    data = tmp_path / "calib.npz"
    data.write_bytes(b"PK fake npz")
    code, out, _ = run(capsys, "datasets", "upload", str(data))
    assert code == 0 and json.loads(out)["num_samples"] == 8
    code, out, err = run(capsys, "datasets", "show", "nope")
    assert (code, out) == (1, "")
    assert err.splitlines()[:2] == ["error: Not Found (HTTP 404)", "  dataset nope does not exist"]


def test_uploading_the_same_bytes_again_says_it_reused_them(api, model_file: Path, tmp_path: Path, capsys) -> None:
    code, out, err = run(capsys, "models", "upload", str(model_file))
    first = json.loads(out)
    assert code == 0 and "reused" not in err
    code, out, err = run(capsys, "models", "upload", str(model_file))
    assert (code, json.loads(out)["id"]) == (0, first["id"])
    assert f"reused model {first['id']}: the project already holds net.onnx (same SHA-256)" in err
    assert "waiting for validation" not in err
    data = tmp_path / "calib.npz"
    data.write_bytes(b"PK fake npz")
    run(capsys, "datasets", "upload", str(data))
    code, out, err = run(capsys, "datasets", "upload", str(data))
    assert code == 0 and f"reused dataset {json.loads(out)['id']}" in err


def test_jobs_list_follows_cursor_pagination_with_all(api, capsys) -> None:
    api.seed_jobs(5)
    code, out, _ = run(capsys, "jobs", "list", "--limit", "2", "--all", "--json")
    assert code == 0
    assert [job["id"] for job in json.loads(out)] == [f"job-{i:02d}" for i in range(5)]
    assert [query.get("cursor") for query in api.list_queries] == [None, "2", "4"]
    assert {query["limit"] for query in api.list_queries} == {"2"}


def test_jobs_list_one_page_points_at_the_next_cursor(api, capsys) -> None:
    api.seed_jobs(5)
    code, out, err = run(capsys, "jobs", "list", "--limit", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "STAGE", "PROGRESS", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["job-00", "job-01"]
    assert "--cursor 2" in err
    code, out, _ = run(capsys, "jobs", "list", "--limit", "2", "--cursor", "4", "--json")
    assert [job["id"] for job in json.loads(out)] == ["job-04"]


def test_jobs_list_passes_the_status_filter(api, capsys) -> None:
    api.seed_jobs(5)
    code, out, _ = run(capsys, "jobs", "list", "--status", "succeeded", "--json")
    assert code == 0
    assert {job["status"] for job in json.loads(out)} == {"succeeded"}
    assert api.list_queries[-1]["status"] == "succeeded"


def test_jobs_submit_builds_the_recipe_from_file_and_overrides(api, tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"calibration": {"observer": "percentile", "batch_size": 8}, "seed": 1}))
    code, out, _ = run(
        capsys, "jobs", "submit", "--model", "m-1", "--dataset", "d-1", "--recipe", str(recipe),
        "--set", "calibration.observer=minmax", "--set", "seed=7", "--set", 'exclude.op_types=["Gemm"]',
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)["status"] == "queued"
    assert api.job_posts == [
        {
            "model_id": "m-1",
            "dataset_id": "d-1",
            "recipe": {
                "calibration": {"observer": "minmax", "batch_size": 8},
                "seed": 7,
                "exclude": {"op_types": ["Gemm"]},
            },
        }
    ]


def test_validation_problem_names_the_field(api, capsys) -> None:
    code, out, err = run(
        capsys, "jobs", "submit", "--model", "m-1", "--dataset", "d-1", "--set", "calibration.observer=kl"
    )
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "error: Validation failed (HTTP 422)",
        "  the request body is invalid",
        "  - recipe.calibration.observer: Input should be 'minmax' or 'percentile'",
    ]


def test_conflict_problem_shows_its_type(api, capsys) -> None:
    api.add_job("job-done", "succeeded")
    api.add_job("job-run", "running")
    code, _, err = run(capsys, "jobs", "cancel", "job-done")
    assert code == 1
    assert "error: Conflict (HTTP 409)" in err and "job is already succeeded" in err
    assert "type: https://quant/errors/terminal" in err
    code, out, _ = run(capsys, "jobs", "cancel", "job-run")
    assert (code, json.loads(out)["status"]) == (0, "canceling")


def test_wrong_api_key_gets_a_hint(api, capsys) -> None:
    code, _, err = run(capsys, "jobs", "show", "job-x", "--api-key", "wrong")
    assert code == 1
    assert "error: Unauthorized (HTTP 401)" in err and "QUANT_API_KEY" in err
    assert api.api_key not in err


def test_non_json_error_body_is_summarized(api, capsys) -> None:
    code, _, err = run(capsys, "jobs", "show", "broken")
    assert code == 1
    assert err.startswith("error: Bad Gateway (HTTP 502)\n  <html><body>502 Bad Gateway</body></html>")


def test_global_options_work_before_and_after_the_command(api, capsys, monkeypatch) -> None:
    api.add_job("job-1")
    monkeypatch.delenv("QUANT_API_URL")
    monkeypatch.delenv("QUANT_API_KEY")
    code, out, _ = run(capsys, "--url", api.url + "/api/v1/", "--api-key", api.api_key, "jobs", "show", "job-1")
    assert (code, json.loads(out)["id"]) == (0, "job-1")
    code, out, _ = run(capsys, "jobs", "show", "job-1", "--url", api.url, "--api-key", api.api_key)
    assert (code, json.loads(out)["id"]) == (0, "job-1")


def test_unreachable_api_exits_1(capsys, monkeypatch) -> None:
    monkeypatch.setenv("QUANT_API_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    code, _, err = run(capsys, "jobs", "show", "x")
    assert code == 1
    assert "cannot talk to the API at http://127.0.0.1:9/api/v1/" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["jobs", "submit", "--model", "m"],
        ["models", "upload", "/no/such/file.onnx"],
        ["jobs", "frobnicate"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    assert "usage: quantctl" in capsys.readouterr().err


def test_bad_override_is_a_usage_error(api, capsys) -> None:
    code, _, err = run(capsys, "jobs", "submit", "--model", "m", "--dataset", "d", "--set", "observer")
    assert code == 2
    assert "--set expects KEY.PATH=VALUE" in err
    assert api.job_posts == []


def test_help_exits_0(capsys) -> None:
    assert main(["--help"]) == 0
    assert "quantize" in capsys.readouterr().out
