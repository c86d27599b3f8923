"""A worker killed with SIGKILL in the middle of a job: the job finishes anyway, never stays running.

Two ways a worker dies:
- its pool process (the one running the task) is killed: Celery's parent sees the loss and, with
  `reject_on_worker_lost`, puts the message back; the redelivery finds the owner pid dead and
  reclaims the job;
- the whole worker (parent and pool) is killed: the message stays unacknowledged in Redis, the
  heartbeat goes stale, and the reaper (Celery beat on the default worker) requeues the job for
  the next worker that starts.
"""

from __future__ import annotations

import io
import os
import signal
import time

import httpx
import numpy as np
import pytest

from tests.conftest import Service
from tests.test_api import _wait_terminal

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


def _start_and_wait_for_calibration(client: httpx.Client, inputs: dict) -> str:
    job = client.post(
        "/jobs", json={"model_id": inputs["model_id"], "dataset_id": inputs["dataset_id"], "recipe": SLOW_RECIPE}
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = client.get(f"/jobs/{job_id}").json()
        if current["status"] == "running" and current["stage"] == "calibrate":
            return job_id
        assert current["status"] in ("queued", "running"), current
        time.sleep(0.05)
    raise AssertionError("the job never reached the calibrate stage")


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
        events = client.get(f"/jobs/{job_id}/events").text
        assert "attempt 2" in events


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
        assert "stopped responding" in client.get(f"/jobs/{job_id}/events").text
