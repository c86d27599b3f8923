"""`GET /metrics` against the real processes: every family moves when the service does.

Jobs by status, queue depth and stage durations are read from the database and the broker, so the
test drives them through the API and a real worker: the job worker is stopped while a job waits
(the queue holds it), then restarted (the job runs its stages). DB-derived values are cached for
`metrics_cache_seconds` (5 s), hence the polling.
"""

from __future__ import annotations

import itertools
import json
import math
import signal
import time
import uuid
from collections.abc import Callable
from datetime import datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import Stack
from samples.tiny import tiny_conv_bytes
from tests.conftest import ARTIFACTS, Service
from tests.test_api import _wait_terminal, assert_problem, tiny_dataset

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
FAST_RECIPE = {"deploy": {"cpu_latency": False, "tensorrt_engine": False}}


def scrape(base_url: str, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{base_url}/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def poll(base_url: str, condition: Callable[[Samples], bool], timeout: float = 20.0) -> Samples:
    """Scrape until `condition` holds (the DB-derived values refresh every 5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(base_url)
        if condition(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def stage_durations(client: httpx.Client, job_id: str) -> dict[str, float]:
    """Seconds from each stage event to the next boundary event, from the job's own event stream."""
    events = [
        json.loads(line[len("data: ") :])
        for line in client.get(f"/jobs/{job_id}/events").text.splitlines()
        if line.startswith("data: ")
    ]
    boundaries = [e for e in events if e["kind"] in ("stage", "status")]
    durations = {}
    for current, following in itertools.pairwise(boundaries):
        if current["kind"] == "stage":
            start, end = (datetime.fromisoformat(e["created_at"]) for e in (current, following))
            durations[current["stage"]] = (end - start).total_seconds()
    return durations


def test_metrics_follow_uploads_queue_jobs_stages_and_webhooks(service: Service) -> None:
    before = scrape(service.url)
    for status in ("queued", "running", "canceling", "succeeded", "failed", "canceled"):
        assert ("quant_jobs", (("status", status),)) in before, status
    assert value(before, "quant_database_up") == 1 and value(before, "quant_broker_up") == 1

    key = service.new_key()
    model_bytes, dataset_bytes = tiny_conv_bytes(), tiny_dataset()
    model, dataset = service.upload(key, model_bytes, dataset_bytes)
    uploaded = scrape(service.url)
    # Exact: the counter adds the file parts' bytes as written to disk, and this test is the only client.
    assert value(uploaded, "quant_upload_bytes_total") - value(before, "quant_upload_bytes_total") == len(
        model_bytes
    ) + len(dataset_bytes)

    service.stack.kill("gpu", signal.SIGTERM)  # idle: a warm shutdown, at once
    try:
        with service.client(key) as client:
            job = client.post(
                "/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": FAST_RECIPE}
            )
            assert job.status_code == 202, job.text
            waiting = poll(service.url, lambda s: value(s, "quant_queue_depth", queue="gpu") >= 1)
            assert value(waiting, "quant_queue_depth", queue="gpu") >= 1
            assert value(waiting, "quant_jobs", status="queued") >= value(before, "quant_jobs", status="queued") + 1
    finally:
        service.start_job_worker()

    with service.client(key) as client:
        assert _wait_terminal(client, job.json()["id"]) == "succeeded"
        durations = stage_durations(client, job.json()["id"])
    assert {"load", "prepare", "calibrate", "export", "evaluate", "store"} <= set(durations), durations

    def stages_recorded(samples: Samples) -> bool:
        return all(
            value(samples, "quant_stage_duration_seconds_count", stage=stage)
            > value(before, "quant_stage_duration_seconds_count", stage=stage)
            for stage in durations
        )

    after = poll(service.url, stages_recorded)
    assert stages_recorded(after), {k: v for k, v in after.items() if k[0].startswith("quant_stage")}
    assert value(after, "quant_queue_depth", queue="gpu") == 0
    assert value(after, "quant_jobs", status="succeeded") >= value(before, "quant_jobs", status="succeeded") + 1
    for stage, seconds in durations.items():
        name = "quant_stage_duration_seconds"
        added = value(after, f"{name}_sum", stage=stage) - value(before, f"{name}_sum", stage=stage)
        # The histogram reads the same two event timestamps as `stage_durations`; 1 ms covers the
        # float sum of the histogram rows against the microsecond datetimes.
        assert abs(added - seconds) < 1e-3, (stage, added, seconds)
        buckets = sorted(
            (float(dict(labels)["le"]), count)  # float("+Inf") is inf
            for (sample, labels), count in after.items()
            if sample == f"{name}_bucket" and dict(labels)["stage"] == stage
        )
        assert buckets[-1][0] == math.inf and len(buckets) > 1, buckets
        counts = [count for _le, count in buckets]
        assert counts == sorted(counts), (stage, buckets)  # cumulative buckets never decrease
        assert counts[-1] == value(after, f"{name}_count", stage=stage)  # +Inf holds every run

    with service.client(key) as client:
        endpoint = client.post("/webhooks", json={"url": "http://127.0.0.1:9/hook"}).json()
        assert client.post(f"/webhooks/{endpoint['id']}/test").status_code == 202

    def total_deliveries(samples: Samples) -> float:
        return sum(value(samples, "quant_webhook_deliveries", status=s) for s in ("pending", "succeeded", "failed"))

    delivered = poll(service.url, lambda s: total_deliveries(s) > total_deliveries(after))
    assert total_deliveries(delivered) == total_deliveries(after) + 1


def test_metrics_token_and_counters_summed_across_api_processes(service: Service, tmp_path) -> None:
    """A second API on the same database: two uvicorn processes, /metrics behind a token."""
    token = "metrics-secret-token"
    stack = Stack(
        env=dict(service.stack.env, QUANT_METRICS_TOKEN=token),
        log_dir=ARTIFACTS / "logs" / f"{tmp_path.name}-{uuid.uuid4().hex[:8]}",
    )
    try:
        url = stack.start_api(workers=2)
        assert_problem(httpx.get(f"{url}/metrics"), 401, "Bearer")
        assert_problem(httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong"}), 401, "Bearer")
        before = value(scrape(url, token), "quant_upload_bytes_total")
        key = service.new_key()
        sizes = []
        for n in range(4, 10):
            body = tiny_dataset(n=n)
            # A new connection per upload, so the two processes both take some.
            response = httpx.post(
                f"{url}/api/v1/datasets",
                params={"filename": "d.npz"},
                content=body,
                headers={"X-API-Key": key, "Content-Type": "application/octet-stream"},
                timeout=60,
            )
            assert response.status_code == 201, response.text
            sizes.append(len(body))
        # Whichever process answers the scrape, it reports the sum over both (exact byte counts).
        for _ in range(6):
            assert value(scrape(url, token), "quant_upload_bytes_total") - before == sum(sizes)
    finally:
        stack.stop()


@pytest.mark.parametrize("path", ["/api/v1/openapi.json"])
def test_metrics_stay_out_of_the_api_document(service: Service, path: str) -> None:
    assert "/metrics" not in httpx.get(f"{service.url}{path}").json()["paths"]
