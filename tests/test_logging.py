"""Structured logs: JSON lines with job_id / request_id from real API and worker processes."""

from __future__ import annotations

import io
import json
import logging
import signal
import uuid

import httpx
import pytest

from jobs.config import Settings
from jobs.logs import ContextFilter, JsonFormatter, TextFormatter, job_context, log_context
from launcher.stack import Stack
from samples.tiny import tiny_conv_bytes
from tests.conftest import ARTIFACTS, Service
from tests.test_api import _wait_terminal, tiny_dataset

FAST_RECIPE = {"deploy": {"cpu_latency": False, "tensorrt_engine": False}}


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test-logs-{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def test_json_lines_carry_context_extras_and_exceptions() -> None:
    logger, stream = _capture(JsonFormatter())

    @job_context
    def run(job_id: str) -> None:
        logger.info("calibrating %d batches", 3, extra={"stage": "calibrate"})

    run("job-1")
    with log_context(request_id="req-9"):
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("failed")
    logger.warning("outside")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "calibrating 3 batches" and first["job_id"] == "job-1" and first["stage"] == "calibrate"
    assert first["level"] == "INFO" and first["time"].endswith("Z") and "request_id" not in first
    assert second["request_id"] == "req-9" and "ValueError: bad" in second["exception"] and "job_id" not in second
    assert "job_id" not in third and "request_id" not in third  # the context ended with its block


def test_text_format_for_development_and_the_switch() -> None:
    logger, stream = _capture(TextFormatter())
    with log_context(job_id="job-2"):
        logger.info("hello")
    assert stream.getvalue().rstrip().endswith("hello  job_id=job-2")
    assert Settings(log_format="auto", environment="development").json_logs is False
    assert Settings(log_format="auto", environment="test").json_logs is False
    assert Settings(log_format="json").json_logs is True


@pytest.fixture
def json_stack(service: Service, tmp_path):
    """The service's database and broker, with an API and the job worker logging JSON."""
    stack = Stack(
        env=dict(service.stack.env, QUANT_LOG_FORMAT="json"),
        log_dir=ARTIFACTS / "logs" / f"{tmp_path.name}-{uuid.uuid4().hex[:8]}",
    )
    service.stack.kill("gpu", signal.SIGTERM)  # our JSON worker takes the gpu queue meanwhile
    try:
        stack.start_worker("gpu", "gpu")
        stack.start_api()
        yield stack
    finally:
        stack.stop()
        service.start_job_worker()


def _json_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_api_and_worker_lines_carry_request_and_job_ids(service: Service, json_stack: Stack) -> None:
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    headers = {"X-API-Key": key, "X-Request-ID": "trace-abc-123"}
    with httpx.Client(base_url=f"{json_stack.api_url}/api/v1", headers=headers, timeout=60) as client:
        job = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": FAST_RECIPE})
        assert job.status_code == 202, job.text
        assert job.headers["x-request-id"] == "trace-abc-123"
        assert _wait_terminal(client, job.json()["id"]) == "succeeded"
        generated = client.get("/jobs", headers={"X-Request-ID": "not a valid id!"}).headers["x-request-id"]
        assert generated != "not a valid id!" and len(generated) == 32
    job_id = job.json()["id"]
    json_stack.stop()  # flush and close the logs

    api_lines = _json_lines(json_stack.log_dir / "api.log")
    traced = [line for line in api_lines if line.get("request_id") == "trace-abc-123"]
    created = [line for line in traced if line.get("method") == "POST"]
    assert len(created) == 1 and created[0]["logger"] == "api.access" and created[0]["status"] == 202
    assert created[0]["path"] == "/api/v1/jobs" and created[0]["duration_ms"] >= 0

    worker_log = json_stack.log_dir / "gpu.log"
    worker_lines = _json_lines(worker_log)
    assert len(worker_lines) >= 4 and any(line["logger"].startswith("celery") for line in worker_lines)
    started = next(i for i, line in enumerate(worker_lines) if line["message"].startswith("job started"))
    ended = next(i for i, line in enumerate(worker_lines) if line["message"].startswith("job ended"))
    pool_pid = worker_lines[started]["process"]
    during = [line for line in worker_lines[started : ended + 1] if line["process"] == pool_pid]
    # Every line the job's process logged while the job ran names the job (whichever module logged it).
    assert during and all(line.get("job_id") == job_id for line in during), during
