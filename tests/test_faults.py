"""Servers restarted under running and queued jobs: every job still ends, none is run twice.

- Redis restarted with jobs queued: Redis here keeps nothing on disk, so the restart loses their
  messages; the reaper finds queued jobs with no message and sends them again.
- PostgreSQL restarted while a job runs: the worker's writes wait and retry; the job finishes on
  its first attempt.
- the API killed and restarted while a job runs: the job goes on (workers do not need the API), and
  an SSE client resumes with Last-Event-ID without missing or repeating an event.

The shared servers (Redis at 6379, PostgreSQL at 5432) are never touched: the Redis and PostgreSQL
tests start their own throwaway instances on free ports.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from jobs import queries
from jobs.db import session_scope
from launcher.servers import PostgresCluster, RedisServer
from launcher.stack import Stack
from tests.conftest import ARTIFACTS, SERVICE_ENV, Service
from tests.test_api import _wait_terminal
from tests.test_e2e import read_events
from tests.test_recovery import (  # slow_job_inputs is a fixture, shared with the crash tests
    EVALUATE_SLOW_RECIPE,
    assert_no_overlap,
    attempts_of,
    slow_job_inputs,  # noqa: F401
)

pytestmark = pytest.mark.e2e

FAST_RECIPE = {"calibration": {"num_samples": 64}, "evaluation": {"max_samples": 64}, "deploy": {"cpu_latency": False}}
# Long enough calibration (batches of one) to restart a server in the middle of it.
SLOW_RECIPE = {
    "calibration": {"observer": "minmax", "batch_size": 1, "num_samples": 1200},
    "evaluation": {"max_samples": 100},
    "deploy": {"cpu_latency": False},
}


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    if not RedisServer.available():
        pytest.skip("redis-server is not installed")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def own_postgres() -> Iterator[PostgresCluster]:
    reason = PostgresCluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = PostgresCluster()
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """Builds a service on the given database and broker; stops it afterwards."""
    stacks: list[Stack] = []

    def build(database_url: str, broker_url: str, **env: str) -> Service:
        var_dir = tmp_path / f"var-{len(stacks)}"
        environment = {
            **os.environ,
            **SERVICE_ENV,
            "DATABASE_URL": database_url,
            "BROKER_URL": broker_url,
            "QUANT_VAR_DIR": str(var_dir),
            **env,
        }
        stack = Stack(env=environment, log_dir=ARTIFACTS / "logs" / f"faults-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        stacks.append(stack)
        stack.migrate()
        stack.start_worker("default", "default", beat=True)
        url = stack.start_api()
        return Service(kind="faults", url=url, database_url=database_url, var_dir=var_dir, stack=stack)

    yield build
    for stack in stacks:
        stack.stop()


def _create_job(client: httpx.Client, model: dict, dataset: dict, recipe: dict) -> str:
    response = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": recipe})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def _messages_now(service: Service, job_id: str) -> list[str]:
    """The event messages so far of a job that has not ended (its SSE stream would wait for the end)."""
    with session_scope(service.database_url) as session:
        return [e.message for e in queries.events_after(session=session, job_id=uuid.UUID(job_id), after_id=0)]


def _events(client: httpx.Client, job_id: str) -> list[dict]:
    with client.stream("GET", f"/jobs/{job_id}/events") as response:
        return [event["data"] for event in read_events(response)]


def test_redis_restart_loses_queued_messages_and_the_reaper_resends_them(
    own_redis: RedisServer, own_stack, digits, tmp_path: Path
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'quant.db'}"
    service = own_stack(sqlite_url, own_redis.url, QUANT_LOST_MESSAGE_TIMEOUT="2")
    model_path, data_path = digits
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), data_path.read_bytes())
    broker = redis.Redis(port=own_redis.port)
    with service.client(key) as client:
        job_ids = [_create_job(client, model, dataset, FAST_RECIPE) for _ in range(3)]
        assert broker.llen("gpu") == 3  # no job worker yet: the messages wait in Redis
        # Past the timeout, with beats of the reaper in between: messages still in Redis are not re-sent.
        time.sleep(4.0)
        assert broker.llen("gpu") == 3
        assert not any("message was lost" in m for j in job_ids for m in _messages_now(service, j))

        own_redis.kill()
        own_redis.start()
        assert broker.llen("gpu") == 0, "the restarted Redis should have forgotten its queues"
        assert all(client.get(f"/jobs/{j}").json()["status"] == "queued" for j in job_ids)

        service.start_job_worker()
        for job_id in job_ids:
            assert _wait_terminal(client, job_id, timeout=180) == "succeeded", client.get(f"/jobs/{job_id}").json()
            job = client.get(f"/jobs/{job_id}").json()
            assert job["attempts"] == 1, job  # sent again, but run once
            events = _events(client, job_id)
            assert any("message was lost" in e["message"] for e in events), [e["message"] for e in events]
            assert len(attempts_of(events)) == 1


def test_postgres_restart_during_a_job(
    own_postgres: PostgresCluster, own_redis: RedisServer, own_stack, digits
) -> None:
    # A heartbeat timeout well above the outage: the job must ride through it, not be reaped and rerun.
    service = own_stack(own_postgres.url, own_redis.url, QUANT_HEARTBEAT_TIMEOUT="15")
    service.start_job_worker()
    model_path, data_path = digits
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), data_path.read_bytes())
    with service.client(key) as client:
        job_id = _create_job(client, model, dataset, SLOW_RECIPE)
        deadline = time.monotonic() + 120
        while client.get(f"/jobs/{job_id}").json()["stage"] != "calibrate":
            assert time.monotonic() < deadline, "the job never reached calibrate"
            time.sleep(0.05)
        before = client.get(f"/jobs/{job_id}").json()["progress"]

        own_postgres.stop()
        time.sleep(3.0)  # every worker write in this window fails and is retried
        own_postgres.start()

        assert _wait_terminal(client, job_id, timeout=180) == "succeeded", client.get(f"/jobs/{job_id}").json()
        job = client.get(f"/jobs/{job_id}").json()
        assert job["attempts"] == 1, job
        events = _events(client, job_id)
        assert_no_overlap(events)
        progress = [e["progress"] for e in events if e["kind"] == "progress" and e["progress"] is not None]
        assert progress and max(progress) > before
    log = (service.stack.log_dir / "gpu.log").read_text()
    assert "database unreachable" in log, "the outage never reached the worker: the test proved nothing"


def test_api_restart_during_a_job_and_sse_resume(service: Service, slow_job_inputs: dict) -> None:  # noqa: F811
    port = int(service.url.rpartition(":")[2])
    inputs = slow_job_inputs
    with service.client(inputs["key"]) as client:
        job_id = _create_job(client, {"id": inputs["model_id"]}, {"id": inputs["dataset_id"]}, EVALUATE_SLOW_RECIPE)
        with client.stream("GET", f"/jobs/{job_id}/events") as response:
            seen = read_events(response, limit=4)
        service.stack.kill("api", signal.SIGKILL)
        with pytest.raises(httpx.ConnectError):
            client.get(f"/jobs/{job_id}")
        progress_before = max(e["data"]["progress"] or 0.0 for e in seen)
        time.sleep(3.0)  # the worker goes on without the API
        service.stack.start_api(port)
        current = client.get(f"/jobs/{job_id}").json()
        assert current["status"] in ("running", "succeeded"), current
        assert current["progress"] > progress_before, (current, progress_before)
        with client.stream("GET", f"/jobs/{job_id}/events", headers={"Last-Event-ID": seen[-1]["id"]}) as response:
            assert response.status_code == 200
            seen += read_events(response)
        assert seen[-1]["data"]["data"]["status"] == "succeeded"
        ids = [int(event["id"]) for event in seen]
        assert ids == sorted(set(ids)), "an event was repeated or out of order"
        everything = [event["id"] for event in _events(client, job_id)]
        assert ids == everything, "the resumed stream missed events"
