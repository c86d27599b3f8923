"""`jobs watch` / `quantize`: the SSE stream, its resume with Last-Event-ID, and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from cli.client import Client
from cli.quantctl import main
from cli.sse import EventParser, parse
from cli.watch import JobWatcher


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("how", ["raise", "close"])
def test_watch_resumes_after_a_drop_without_losing_or_repeating_events(api, capsys, how: str) -> None:
    api.add_job("job-1", "queued", events="succeeded")
    api.drops["job-1"] = (3, how)  # the first connection ends after events 1..3
    code, out, err = run(capsys, "jobs", "watch", "job-1")
    assert code == 0
    assert out == "job job-1 succeeded\n"
    assert api.event_connections == [("job-1", None), ("job-1", "3")]
    # Each log line exactly once, in order; event 3 (the first log) came before the drop.
    logs = [line for line in err.splitlines() if "observing" in line or "QuantizeLinear" in line]
    assert logs == ["03:04:05 [calibrate] observing 12 tensors", "03:04:05 [export] inserted 24 QuantizeLinear nodes"]


def test_watch_without_a_bar_prints_stage_changes(api, capsys) -> None:
    api.add_job("job-1", "queued", events="succeeded")
    code, _, err = run(capsys, "jobs", "watch", "job-1", "--no-progress")
    assert code == 0
    lines = err.splitlines()
    assert [line for line in lines if line.startswith(("stage:", "status:"))] == [
        "status: running (attempt 1) on fake:1",
        "stage: calibrate",
        "stage: export",
        "status: succeeded",
    ]


def test_watcher_tracks_progress_and_stage(api) -> None:
    api.add_job("job-1", "queued", events="succeeded")
    api.drops["job-1"] = (5, "raise")
    with Client(api.url, api.api_key) as client:
        watcher = JobWatcher(client, "job-1", progress=False)
        job = watcher.run()
    assert job["status"] == "succeeded"
    # The server reset the connection mid-body: httpx saw an incomplete chunked response.
    assert isinstance(watcher.stream.last_error, httpx.RemoteProtocolError)
    assert watcher.stream.connections == 2
    assert watcher.stage == "export"
    assert watcher.bar.n == pytest.approx(1.0)
    assert watcher.stream.last_event_id == "8"


@pytest.mark.parametrize("final", ["failed", "canceled"])
def test_watch_exits_1_when_the_job_does_not_succeed(api, capsys, final: str) -> None:
    api.add_job("job-1", "running", events=final, error="calibration diverged")
    code, out, err = run(capsys, "jobs", "watch", "job-1")
    assert code == 1
    assert out == f"job job-1 {final}\n"
    assert f"error: job job-1 {final}: calibration diverged" in err


def test_watch_falls_back_to_the_job_when_the_stream_stays_empty(api, capsys) -> None:
    # A finished job whose events were pruned: every connection closes at once with nothing to say.
    api.add_job("job-old", "succeeded", events=None)
    code, out, _ = run(capsys, "jobs", "watch", "job-old")
    assert (code, out) == (0, "job job-old succeeded\n")
    assert len(api.event_connections) == 2  # JobWatcher's max_failures, then GET /jobs/{id}


def test_watch_unknown_job_is_a_problem(api, capsys) -> None:
    code, _, err = run(capsys, "jobs", "watch", "nope")
    assert code == 1
    assert "error: Not Found (HTTP 404)" in err


def test_quantize_runs_the_whole_round_trip(api, tmp_path: Path, capsys) -> None:
    model, data, out_dir = tmp_path / "net.onnx", tmp_path / "calib.npz", tmp_path / "out"
    model.write_bytes(api.model_bytes)
    data.write_bytes(b"PK fake npz")
    api.drops["job-new-1"] = (2, "raise")
    code, out, err = run(
        capsys, "quantize", str(model), str(data), "--set", "calibration.observer=minmax", "-o", str(out_dir)
    )
    assert code == 0, err
    assert [upload["collection"] for upload in api.uploads] == ["models", "datasets"]
    assert api.job_posts[0]["recipe"] == {"calibration": {"observer": "minmax"}}
    assert api.event_connections == [("job-new-1", None), ("job-new-1", "2")]
    for name, data_bytes in api.artifacts.items():
        assert (out_dir / name).read_bytes() == data_bytes
    assert "per-output error" in out and "artifacts:" in out
    assert str(out_dir / "model.qdq.onnx") in out


def test_quantize_stops_at_an_invalid_model(api, tmp_path: Path, capsys) -> None:
    model, data = tmp_path / "bad.onnx", tmp_path / "calib.npz"
    model.write_bytes(b"x")
    data.write_bytes(b"y")
    code, _, err = run(capsys, "quantize", str(model), str(data))
    assert code == 1
    assert "is invalid" in err
    assert [upload["collection"] for upload in api.uploads] == ["models"]


# ---------------------------------------------------------------- the parser alone


def test_parser_follows_the_event_stream_rules() -> None:
    lines = [
        ": keep-alive comment",
        "retry: 2500",
        "id: 7",
        "event: log",
        "data: first line",
        "data:second line",
        "",
        "",  # a blank line with nothing pending dispatches nothing
        'data: {"kind": "progress", "progress": 0.5}',
        "",
        "id: 9",
        "",  # an id alone dispatches nothing but moves the last event id
        "data: tail",
        "",
    ]
    events = list(parse(lines))
    assert [(e.id, e.event, e.data) for e in events] == [
        ("7", "log", "first line\nsecond line"),
        ("7", "message", '{"kind": "progress", "progress": 0.5}'),
        ("9", "message", "tail"),
    ]
    assert events[1].json() == {"kind": "progress", "progress": 0.5}
    assert events[0].json() == {}  # not JSON: no exception


def test_parser_reads_retry_and_ignores_unknown_fields() -> None:
    parser = EventParser()
    for line in ["retry: 1500", "retry: soon", "bogus: 1", "data", ""]:
        event = parser.feed(line)
    assert parser.retry_ms == 1500
    assert event is not None and event.data == ""
    assert json.loads(json.dumps(event.json())) == {}
