"""Graceful shutdown of a job worker with SIGTERM: the job finishes or goes back to the queue.

(SIGKILL, the ungraceful case, is tests/test_recovery.py.) Three ways SIGTERM reaches a worker:
- to the worker's main process (docker stop, kill PID): warm shutdown, the running job finishes;
- to the pool process running the job: the job is released (queued again, attempt not counted)
  and the still-running worker takes it up again;
- to the whole process group (kill -TERM -PGID, systemd): released, and the worker exits; the job
  waits `queued` for the next worker.
And Celery's soft time limit (SIGUSR1 to the pool process) fails the job, naming the limit.
Never `running` without a worker. And the API: SIGTERM lets requests in flight finish.
"""

from __future__ import annotations

import io
import os
import re
import signal
import time
import uuid

import httpx
import numpy as np
import pytest

from jobs import queries
from jobs.db import session_scope
from launcher.stack import Stack
from tests.conftest import ARTIFACTS, Service
from tests.test_api import _wait_terminal, tiny_dataset

pytestmark = pytest.mark.e2e

# Batch size 1 over thousands of samples: calibration lasts long enough to be interrupted mid-stage.
SLOW_RECIPE = {
    "calibration": {"observer": "minmax", "batch_size": 1, "num_samples": 6000},
    "evaluation": {"holdout_fraction": 0.1, "max_samples": 200},
    "deploy": {"cpu_latency": False, "tensorrt_engine": False},
}


@pytest.fixture(scope="module")
def slow_inputs(service: Service, digits) -> dict:
    model_path, data_path = digits
    with np.load(data_path) as archive:
        images = np.tile(archive["input"], (4, 1, 1, 1))
    buffer = io.BytesIO()
    np.savez(buffer, input=images)
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), buffer.getvalue())
    return {"key": key, "request": {"model_id": model["id"], "dataset_id": dataset["id"], "recipe": SLOW_RECIPE}}


def _calibrating_job(client: httpx.Client, request: dict) -> str:
    job = client.post("/jobs", json=request)
    assert job.status_code == 202, job.text
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current = client.get(f"/jobs/{job.json()['id']}").json()
        if current["status"] == "running" and current["stage"] == "calibrate":
            return current["id"]
        time.sleep(0.05)
    raise AssertionError("the job never reached the calibrate stage")


def _owner_pid(service: Service, job_id: str) -> int:
    with session_scope(service.database_url) as session:
        return int(queries.get_job_unscoped(session=session, job_id=uuid.UUID(job_id)).claimed_by.rpartition(":")[2])


def test_sigterm_to_the_main_process_lets_the_job_finish(service: Service, slow_inputs: dict) -> None:
    with service.client(slow_inputs["key"]) as client:
        job_id = _calibrating_job(client, slow_inputs["request"])
        worker = service.stack.processes.pop("gpu")
        try:
            os.kill(worker.pid, signal.SIGTERM)  # the main process only: Celery's warm shutdown
            assert _wait_terminal(client, job_id, timeout=240) == "succeeded"
            assert worker.wait(timeout=60) == 0  # and then it exits, cleanly
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
            service.start_job_worker()
        assert client.get(f"/jobs/{job_id}").json()["attempts"] == 1


def test_sigterm_to_the_pool_process_releases_the_job(service: Service, slow_inputs: dict) -> None:
    with service.client(slow_inputs["key"]) as client:
        job_id = _calibrating_job(client, slow_inputs["request"])
        pool_pid = _owner_pid(service, job_id)
        assert pool_pid != service.stack.processes["gpu"].pid
        os.kill(pool_pid, signal.SIGTERM)
        assert _wait_terminal(client, job_id, timeout=240) == "succeeded"  # the same worker took it up again
        job = client.get(f"/jobs/{job_id}").json()
        events = client.get(f"/jobs/{job_id}/events").text
    assert f"worker {service_host_pid(pool_pid)} shut down; job requeued" in events
    assert job["attempts"] == 1  # a release is not a failed attempt


def test_sigterm_to_the_whole_worker_leaves_the_job_queued(service: Service, slow_inputs: dict) -> None:
    with service.client(slow_inputs["key"]) as client:
        job_id = _calibrating_job(client, slow_inputs["request"])
        service.stack.kill("gpu", signal.SIGTERM)  # parent and pool; returns once the worker has exited
        try:
            job = client.get(f"/jobs/{job_id}").json()
            assert (job["status"], job["stage"], job["progress"], job["attempts"]) == ("queued", None, 0.0, 0), job
            storage = service.var_dir / "storage"
            assert not [p for p in storage.rglob(f"*{job_id}*") if p.is_file()]  # no partial artifacts
        finally:
            service.start_job_worker()
        assert _wait_terminal(client, job_id, timeout=240) == "succeeded"
        assert client.get(f"/jobs/{job_id}").json()["attempts"] == 1


def test_the_soft_time_limit_fails_the_job_and_names_it(service: Service, digits) -> None:
    """Celery's soft time limit (SIGUSR1 from the pool's parent) stops the job at its next cancellation
    point: failed, with the limit and the stage in the error, and no partial artifacts."""
    model_path, data_path = digits
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), data_path.read_bytes())
    # Work that outlasts the limit many times over on any machine: AdaRound at its most steps (100000 per
    # layer, polled for cancellation every 10). Not a long calibration: its length is what the engine makes
    # shorter (30000 batches of one take 1.4-1.7 s, and such a job ends in time).
    recipe = {
        **SLOW_RECIPE,
        "calibration": {"num_samples": 256},
        "reconstruction": {"method": "adaround", "iters": 100_000},
    }
    service.stack.kill("gpu", signal.SIGTERM)  # idle: a warm shutdown, at once
    limits = {"QUANT_JOB_SOFT_TIME_LIMIT": "2", "QUANT_JOB_TIME_LIMIT": "120"}
    service.stack.start_worker("gpu", "gpu", concurrency=1, env=limits)
    try:
        with service.client(key) as client:
            request = {"model_id": model["id"], "dataset_id": dataset["id"], "recipe": recipe}
            job_id = client.post("/jobs", json=request).json()["id"]
            assert _wait_terminal(client, job_id, timeout=120) == "failed"
            job = client.get(f"/jobs/{job_id}").json()
        assert re.fullmatch(r"time limit of 2 s exceeded during [a-z]+", job["error"]), job
        assert job["attempts"] == 1
        assert not [p for p in (service.var_dir / "storage").rglob(f"*{job_id}*") if p.is_file()]
    finally:
        service.stack.kill("gpu", signal.SIGTERM)
        service.start_job_worker()


def service_host_pid(pid: int) -> str:
    import socket

    return f"{socket.gethostname()}:{pid}"


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_to_the_api_lets_requests_in_flight_finish(service: Service, workers: int) -> None:
    """uvicorn's graceful shutdown: an upload still streaming when SIGTERM arrives is completed, by the
    one in-process server or by the `api.serve` worker that has it."""
    stack = Stack(env=service.stack.env, log_dir=ARTIFACTS / "logs" / f"api-shutdown-{uuid.uuid4().hex[:8]}")
    url = stack.start_api(graceful_seconds=20, workers=workers)
    api = stack.processes["api"]
    body = tiny_dataset(n=200)  # 150 KB sent in 4 KiB pieces over ~2 s

    def slow():
        for offset in range(0, len(body), 4096):
            if offset == 8 * 4096:
                os.killpg(api.pid, signal.SIGTERM)  # mid-request
            time.sleep(0.05)
            yield body[offset : offset + 4096]

    try:
        response = httpx.post(
            f"{url}/api/v1/datasets",
            params={"filename": "d.npz"},
            content=slow(),
            headers={"X-API-Key": service.new_key(), "Content-Type": "application/octet-stream"},
            timeout=60,
        )
        assert response.status_code == 201, response.text
        assert response.json()["size_bytes"] == len(body)
        # Then it exits: uvicorn re-raises the SIGTERM it caught once its shutdown is done, so the
        # status is "killed by SIGTERM", but only after the request above was answered.
        assert api.wait(timeout=30) == -signal.SIGTERM
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/api/v1/health", timeout=5)
    finally:
        stack.stop()
