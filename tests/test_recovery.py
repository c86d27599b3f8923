"""A worker killed with SIGKILL in the middle of a job: the job finishes anyway, never stays running.

Two ways a worker dies:
- its pool process (the one running the task) is killed: Celery's parent sees the loss and, with
  `reject_on_worker_lost`, puts the message back; the redelivery finds the owner pid dead and
  reclaims the job;
- the whole worker (parent and pool) is killed: the message stays unacknowledged in Redis, the
  heartbeat goes stale, and the reaper (Celery beat on the default worker) requeues the job for
  the next worker that starts.

Every test also checks that no two attempts ran at once (each attempt's progress events form one
non-decreasing sequence; two interleaved runs would go backwards), and a worker killed after export
shows that the retry reuses the checkpoint instead of calibrating and exporting again.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import signal
import time

import httpx
import numpy as np
import pytest

from tests.conftest import Service
from tests.test_api import _wait_terminal
from tests.test_e2e import read_events

pytestmark = pytest.mark.e2e

# Batch size 1 over thousands of samples: calibration lasts long enough to be killed mid-stage.
SLOW_RECIPE = {
    "calibration": {"observer": "minmax", "batch_size": 1, "num_samples": 6000},
    "evaluation": {"holdout_fraction": 0.1, "max_samples": 200},
}


@pytest.fixture(scope="module")
def slow_job_inputs(service: Service, digits) -> dict:
    model_path, data_path = digits
    with np.load(data_path) as archive:
        images = np.tile(archive["input"], (4, 1, 1, 1))  # 7188 samples
    buffer = io.BytesIO()
    np.savez(buffer, input=images)
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), buffer.getvalue())
    return {"key": key, "model_id": model["id"], "dataset_id": dataset["id"]}


def _start_and_wait_for_calibration(
    client: httpx.Client, inputs: dict, recipe: dict = SLOW_RECIPE, stage: str = "calibrate"
) -> str:
    job = client.post(
        "/jobs", json={"model_id": inputs["model_id"], "dataset_id": inputs["dataset_id"], "recipe": recipe}
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = client.get(f"/jobs/{job_id}").json()
        if current["status"] == "running" and current["stage"] == stage:
            return job_id
        assert current["status"] in ("queued", "running"), current
        time.sleep(0.05)
    raise AssertionError(f"the job never reached the {stage} stage")


def _events(client: httpx.Client, job_id: str) -> list[dict]:
    """Every event of the job, oldest first, through the JSON-per-line SSE `data:` fields."""
    with client.stream("GET", f"/jobs/{job_id}/events") as response:
        return [event["data"] for event in read_events(response)]


def attempts_of(events: list[dict]) -> list[list[dict]]:
    """The events split at each `running (attempt N)` status event, one list per attempt."""
    attempts: list[list[dict]] = []
    for event in events:
        if event["kind"] == "status" and (event["data"] or {}).get("status") == "running":
            attempts.append([])
        elif attempts:
            attempts[-1].append(event)
    return attempts


def assert_no_overlap(events: list[dict]) -> None:
    """Within an attempt, progress only grows (to the 1e-9 a float sum of stage weights can wobble):
    events of two concurrent runs of one job would interleave and step back."""
    for number, attempt in enumerate(attempts_of(events), start=1):
        values = [e["progress"] for e in attempt if e["kind"] in ("stage", "progress") and e["progress"] is not None]
        assert all(b >= a - 1e-9 for a, b in itertools.pairwise(values)), (number, values)


def _owner_pid(service: Service, job_id: str) -> int:
    from jobs import queries
    from jobs.db import session_scope

    with session_scope(service.database_url) as session:
        import uuid

        job = queries.get_job_unscoped(session=session, job_id=uuid.UUID(job_id))
        return int(job.claimed_by.rpartition(":")[2])


def test_pool_process_killed_mid_job(service: Service, slow_job_inputs: dict) -> None:
    with service.client(slow_job_inputs["key"]) as client:
        job_id = _start_and_wait_for_calibration(client, slow_job_inputs)
        pid = _owner_pid(service, job_id)
        assert pid != service.stack.processes["gpu"].pid, "the job should run in a pool process, not the parent"
        os.kill(pid, signal.SIGKILL)
        status = _wait_terminal(client, job_id, timeout=240)
        job = client.get(f"/jobs/{job_id}").json()
        assert status == "succeeded", job
        assert job["attempts"] >= 2, job
        events = _events(client, job_id)
        # one recovery, at the stage the kill found: calibrate, or the one after it when calibrate ended between
        # the test's last look and the kill (a loaded machine stretches that gap); by the worker, which sees its
        # pool process die, or by the reaper, when the dead process's heartbeat goes stale first (the suffix)
        lost = [e["message"] for e in events if e["message"].startswith("worker lost")]
        recovered = r"worker lost during (calibrate|clip); attempt 2( queued \(worker \S+ stopped responding\))?"
        assert len(lost) == 1 and re.fullmatch(recovered, lost[0]), lost
        assert_no_overlap(events)


def test_whole_worker_killed_mid_job(service: Service, slow_job_inputs: dict) -> None:
    with service.client(slow_job_inputs["key"]) as client:
        job_id = _start_and_wait_for_calibration(client, slow_job_inputs)
        service.stack.kill("gpu")  # SIGKILL to the worker's parent and its pool
        time.sleep(1.0)
        assert client.get(f"/jobs/{job_id}").json()["status"] == "running"  # nobody knows yet
        service.start_job_worker()
        status = _wait_terminal(client, job_id, timeout=240)
        job = client.get(f"/jobs/{job_id}").json()
        assert status == "succeeded", job
        assert job["attempts"] >= 2
        events = _events(client, job_id)
        assert any(e["message"].startswith("worker lost during calibrate; attempt 2") for e in events), events
        assert_no_overlap(events)


# Calibration short, evaluation long (thousands of batches of one): killed while evaluating, after export.
EVALUATE_SLOW_RECIPE = {
    "calibration": {"observer": "minmax", "batch_size": 1, "num_samples": 300},
    "evaluation": {"holdout_fraction": 0.6, "max_samples": 4000},
    "deploy": {"cpu_latency": False},
}


def test_retry_after_export_reuses_the_checkpoint(service: Service, slow_job_inputs: dict) -> None:
    with service.client(slow_job_inputs["key"]) as client:
        job_id = _start_and_wait_for_calibration(client, slow_job_inputs, EVALUATE_SLOW_RECIPE, stage="evaluate")
        os.kill(_owner_pid(service, job_id), signal.SIGKILL)
        status = _wait_terminal(client, job_id, timeout=240)
        assert status == "succeeded", client.get(f"/jobs/{job_id}").json()
        events = _events(client, job_id)
        attempts = attempts_of(events)
        assert len(attempts) == 2, [e["message"] for e in events]
        stages = [[e["stage"] for e in attempt if e["kind"] == "stage"] for attempt in attempts]
        trained = ["calibrate", "reconstruct", "mixed_precision", "qat", "export"]
        assert stages[0][-6:] == [*trained, "evaluate"], stages[0]
        # The retry starts over from the data but takes the exported model from the checkpoint.
        assert not set(trained) & set(stages[1]), stages[1]
        assert "prepare" in stages[1] and "evaluate" in stages[1] and "store" in stages[1], stages[1]
        assert any(e["message"] == "reused from an earlier attempt: calibrate, export" for e in attempts[1])
        report = client.get(f"/jobs/{job_id}/report").json()
        assert report["resumed"] == ["calibrate", "export"]
        assert "calibrate" not in report["stage_seconds"]
        assert_no_overlap(events)
        # The worker removes the work directory once the terminal state has committed (a commit that fails
        # leaves it to the retry), so a reader can see "succeeded" a moment before it is gone.
        work = service.var_dir / "storage" / ".work" / job_id
        deadline = time.monotonic() + 30
        while work.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not work.exists(), "the work directory outlived the job"
