"""Routing of the TensorRT engine stage to GPU workers, through real API, worker and broker processes.

No GPU here. The only stand-in is the GPU itself: one extra, real Celery worker consumes the `engine`
queue with ``QUANT_FAKE_ENGINE_PROBE`` set, so it registers as a node with a GPU and TensorRT. Everything
else is real: the job's worker hands the build off through Redis, the engine worker claims it, runs
quantcore's ``build_engine`` for real (which finds no CUDA and says so), and reports back. So these
tests check the hand-off, the bounded wait, cancellation and what the job records, never an engine.

Order matters within a service (each test leaves the registry as the next one expects): no engine
worker → a consuming engine worker → the same worker no longer consuming (waits end by the clock).
"""

from __future__ import annotations

import json
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery

from jobs import workers
from jobs.db import session_scope
from jobs.queue import ENGINE_QUEUE
from samples.digits import HELDOUT_FILE
from tests.conftest import SERVICE_ENV, Service

pytestmark = pytest.mark.e2e

FAKE_GPU = {"gpu": {"name": "Simulated GPU (tests)", "compute_capability": "8.9"}, "tensorrt_version": "10.13.0"}
ENGINE_NODE = f"engine@{socket.gethostname()}"
WAIT = float(SERVICE_ENV["QUANT_ENGINE_WAIT_SECONDS"])
RECIPE = {"calibration": {"num_samples": 64}, "evaluation": {"holdout_fraction": 0.3}}  # tensorrt platform


def _submit(service: Service, digits: tuple[Path, Path]) -> tuple[str, str]:
    model_path, _ = digits
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), (model_path.parent / HELDOUT_FILE).read_bytes())
    with service.client(key) as client:
        created = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": RECIPE})
        assert created.status_code == 202, created.text
    return key, created.json()["id"]


def _poll(service: Service, key: str, job_id: str, done, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    with service.client(key) as client:
        while time.monotonic() < deadline:
            job = client.get(f"/jobs/{job_id}").json()
            if done(job):
                return job
            time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not reach the expected state within {timeout} s: {job}")


def _finished(service: Service, key: str, job_id: str) -> tuple[dict, dict]:
    job = _poll(service, key, job_id, lambda j: j["status"] in ("succeeded", "failed", "canceled"))
    with service.client(key) as client:
        report = client.get(f"/jobs/{job_id}/report").json() if job["status"] == "succeeded" else {}
    return job, report


def _registered(service: Service, name: str, timeout: float = 60.0) -> workers.Worker:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with session_scope(service.database_url) as session:
            row = workers.get_worker(session=session, name=name, timeout=60)
        if row is not None:
            return row
        time.sleep(0.2)
    raise AssertionError(f"worker {name} did not register within {timeout} s")


@pytest.fixture(scope="module")
def engine_worker(service: Service):
    """Started lazily by the tests that need it; stopped (and so deregistered) at the module's end."""
    started = []

    def start() -> workers.Worker:
        if not started:
            service.stack.start_worker("engine", "engine", env={"QUANT_FAKE_ENGINE_PROBE": json.dumps(FAKE_GPU)})
            started.append(True)
        return _registered(service, ENGINE_NODE)

    yield start
    if started:  # a warm shutdown: the worker deregisters itself
        service.stack.kill("engine", signal.SIGTERM)


def test_without_a_gpu_worker_the_engine_stage_is_skipped_at_once(service: Service, digits) -> None:
    key, job_id = _submit(service, digits)
    job, report = _finished(service, key, job_id)
    assert job["status"] == "succeeded", job  # the job keeps its QDQ model; only the engine is missing
    assert job["engine_status"] == "skipped"
    assert job["engine_reason"] == "no GPU worker with TensorRT is registered"
    assert job["engine_worker"] is None and job["engine_gpu"] is None
    engine = report["engine"]
    assert engine["status"] == "skipped" and engine["reason"] == job["engine_reason"]
    assert engine["qdq_checks"]["errors"] == 0  # the static rule checks ran although nothing was built
    # "at once": no hand-off wait; the stage takes far less than the configured wait (8 s in tests).
    assert report["stage_seconds"]["engine"] < WAIT / 2, report["stage_seconds"]


def test_a_registered_gpu_worker_takes_the_build_and_the_job_records_it(
    service: Service, digits, engine_worker
) -> None:
    row = engine_worker()
    assert row.engine_capable and row.gpu_name == FAKE_GPU["gpu"]["name"] and row.queues == ["engine"]
    assert row.capabilities["simulated"] is True  # the registry says this GPU is a stand-in
    with session_scope(service.database_url) as session:  # the job workers registered too, as not capable
        job_worker = workers.get_worker(session=session, name=f"gpu@{socket.gethostname()}", timeout=60)
    assert job_worker is not None and not job_worker.engine_capable and "engine" in job_worker.reason

    key, job_id = _submit(service, digits)
    job, report = _finished(service, key, job_id)
    assert job["status"] == "succeeded", job
    assert job["engine_worker"] == ENGINE_NODE  # handed off, taken by the engine worker
    assert job["engine_gpu"] == FAKE_GPU["gpu"]["name"]
    assert job["engine_tensorrt_version"] == FAKE_GPU["tensorrt_version"]
    # The build really ran there, on a machine with no CUDA and no TensorRT, and said so.
    assert job["engine_status"] == "skipped", job
    assert "CUDA" in job["engine_reason"] and "TensorRT" in job["engine_reason"], job["engine_reason"]
    assert report["engine"]["status"] == "skipped" and report["engine"]["reason"] == job["engine_reason"]
    assert report["engine"]["qdq_checks"]["errors"] == 0
    # The wait ended when the engine worker reported, long before the configured limit.
    assert report["stage_seconds"]["engine"] < WAIT, report["stage_seconds"]
    with service.client(key) as client:
        artifacts = {a["name"] for a in client.get(f"/jobs/{job_id}/artifacts").json()}
        events = client.get(f"/jobs/{job_id}/events").text
    assert "model.engine" not in artifacts and "model.qdq.onnx" in artifacts
    assert f"engine build taken by {ENGINE_NODE}" in events


def _stop_consuming(service: Service) -> None:
    """The engine worker stays registered and alive but takes no builds (as when it is busy)."""
    app = Celery(broker=service.stack.env["BROKER_URL"], set_as_current=False)
    replies = app.control.cancel_consumer(ENGINE_QUEUE, destination=[ENGINE_NODE], reply=True, timeout=10)
    assert replies, "the engine worker did not answer the remote-control request"


def test_the_wait_for_a_busy_gpu_worker_is_bounded(service: Service, digits, engine_worker) -> None:
    engine_worker()
    _stop_consuming(service)
    key, job_id = _submit(service, digits)
    job, report = _finished(service, key, job_id)
    assert job["status"] == "succeeded", job
    assert job["engine_status"] == "skipped"
    assert job["engine_reason"].startswith(f"no GPU worker took the engine build within {WAIT:g} s"), job
    assert ENGINE_NODE in job["engine_reason"]  # names who was registered
    assert job["engine_worker"] is None
    # Bounded: at least the configured wait, and not much more (2 s of polling and DB slack).
    assert WAIT <= report["stage_seconds"]["engine"] < WAIT + 2.0, report["stage_seconds"]


def test_cancel_while_waiting_for_a_gpu_worker_stops_promptly(service: Service, digits, engine_worker) -> None:
    engine_worker()
    _stop_consuming(service)  # idempotent: the previous test may have run alone
    key, job_id = _submit(service, digits)
    _poll(service, key, job_id, lambda j: j["engine_status"] == "queued")  # handed off, nobody takes it
    with service.client(key) as client:
        asked = time.monotonic()
        assert client.post(f"/jobs/{job_id}/cancel").json()["status"] in ("canceling", "canceled")
    job = _poll(service, key, job_id, lambda j: j["status"] in ("succeeded", "failed", "canceled"), timeout=WAIT)
    took = time.monotonic() - asked
    assert job["status"] == "canceled", job
    # Promptly: the wait polls every 0.5 s; 3 s leaves room for a loaded machine, and is under the 8 s wait.
    assert took < 3.0, took
    assert job["engine_status"] == "skipped" and "canceled" in job["engine_reason"]


def test_a_job_worker_shut_down_during_the_wait_retires_the_hand_off(service: Service, digits, engine_worker) -> None:
    """SIGTERM to the job's worker while a build waits at a busy GPU worker: the job goes back to the
    queue, and its hand-off with it (a GPU worker that frees up must not build for an attempt that is
    over); the next attempt hands off anew."""
    engine_worker()
    _stop_consuming(service)
    key, job_id = _submit(service, digits)
    _poll(service, key, job_id, lambda j: j["engine_status"] == "queued")
    service.stack.kill("gpu", signal.SIGTERM)  # parent and pool; returns once the worker has exited
    try:
        with service.client(key) as client:
            job = client.get(f"/jobs/{job_id}").json()
        assert (job["status"], job["attempts"]) == ("queued", 0), job
        assert job["engine_status"] == "skipped", job
        assert job["engine_reason"] == "the job was queued again before its engine build ended"
        with session_scope(service.database_url) as session:
            state = workers.engine_state(session=session, job_id=uuid.UUID(job_id))
        assert state is not None and state.request is None  # the engine worker's claim would now fail
    finally:
        service.start_job_worker()
    job, _ = _finished(service, key, job_id)
    assert (job["status"], job["attempts"]) == ("succeeded", 1), job
    assert job["engine_reason"].startswith(f"no GPU worker took the engine build within {WAIT:g} s"), job


def test_a_job_worker_with_a_gpu_builds_its_own_engine(service: Service, digits) -> None:
    """A job worker that itself has a GPU with TensorRT (and consumes `engine`) builds in place, no hand-off."""
    node = f"gpuengine@{socket.gethostname()}"
    service.stack.kill("gpu", signal.SIGTERM)  # the session's plain job worker steps aside for this test
    service.stack.start_worker("gpuengine", "gpu,engine", env={"QUANT_FAKE_ENGINE_PROBE": json.dumps(FAKE_GPU)})
    try:
        assert _registered(service, node).engine_capable
        key, job_id = _submit(service, digits)
        job, report = _finished(service, key, job_id)
    finally:
        service.stack.kill("gpuengine", signal.SIGTERM)
        service.start_job_worker()
    assert job["status"] == "succeeded", job
    assert job["engine_worker"] == node and job["engine_gpu"] == FAKE_GPU["gpu"]["name"]
    # build_engine ran right there and found no CUDA: the stage says so, with the machine's own reason.
    assert job["engine_status"] == "skipped" and "CUDA" in job["engine_reason"], job
    assert report["engine"]["reason"] == job["engine_reason"]
    with service.client(key) as client:
        events = client.get(f"/jobs/{job_id}/events").text
    assert "engine build taken by" not in events  # the event an engine worker adds when it takes a hand-off
