"""Webhooks through real processes: a real HTTP receiver on loopback, signatures checked with the
reference `standardwebhooks` package, on SQLite and PostgreSQL (the `service` fixture).

The test service shortens the retry schedule to 0, 1, 3, 6 s, polls every 0.5 s, times attempts
out after 2 s and allows 127.0.0.1 (only) as a target; everything else private stays refused.
The rules that need no service (SSRF, signing, backoff, settings) are in test_webhook_rules.py.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from jobs import keys, queries, webhooks
from jobs.db import session_scope
from jobs.models import JobStatus, WebhookEndpoint, WebhookMessage, utcnow
from samples.tiny import tiny_conv_bytes
from tests.conftest import Service
from tests.test_api import _wait_terminal, assert_problem, tiny_dataset

pytestmark = pytest.mark.e2e

# Scheduling slack: the poller runs every 0.5 s and a delivery task takes a few hundred ms on a busy
# 2-core machine, so an attempt lands up to ~1.5 s after it is due, never before (minus 10 % jitter).
LATE = 1.5


# A receiver: a real HTTP server on 127.0.0.1 ----------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    def verify(self, secret: str) -> dict:
        """The parsed body when `secret` signed it (any of the signatures), else raises."""
        return Webhook(secret).verify(self.body, self.headers)


Answer = tuple[int, dict[str, str]] | tuple[int, dict[str, str], float]  # status, headers[, delay s]


class Receiver:
    """Records every request on arrival; answers each path from its plan, then with 200s."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.plans: dict[str, list[Answer]] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    receiver.requests.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                    )
                    plan = receiver.plans.get(self.path)
                    status, headers, *delay = plan.pop(0) if plan else (200, {})
                time.sleep(delay[0] if delay else 0)
                answer = f"answer {status}".encode()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):  # the sender gave up or died meanwhile
                    pass

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def path(self, *plan: int | Answer) -> str:
        """A fresh path answered with `plan` in order (then 200s); returns its URL."""
        path = f"/hook/{uuid.uuid4().hex[:12]}"
        self.plans[path] = [p if isinstance(p, tuple) else (p, {}) for p in plan]
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, url: str) -> list[Received]:
        path = "/" + url.split("/", 3)[3]
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def wait(self, url: str, count: int, timeout: float = 60.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.at(url)
            if len(got) >= count:
                return got
            time.sleep(0.1)
        raise AssertionError(f"{url} received {len(self.at(url))} requests, expected {count} within {timeout} s")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def project(service: Service) -> dict:
    """A project with the tiny model and a dataset, so tests can run (short) jobs."""
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    return {"key": key, "model_id": model["id"], "dataset_id": dataset["id"]}


def create_endpoint(client: httpx.Client, url: str, **fields) -> dict:
    response = client.post("/webhooks", json={"url": url, **fields})
    assert response.status_code == 201, response.text
    return response.json()


def _signed_by(request: Received, secret: str) -> bool:
    try:
        request.verify(secret)
    except WebhookVerificationError:
        return False
    return True


def wait_delivery(client: httpx.Client, path: str, predicate, timeout: float = 60.0) -> dict:
    """Poll a deliveries listing until one item satisfies `predicate`."""
    deadline = time.monotonic() + timeout
    items: list = []
    while time.monotonic() < deadline:
        items = client.get(path).json()["items"]
        for item in items:
            if predicate(item):
                return item
        time.sleep(0.2)
    raise AssertionError(f"no delivery matched within {timeout} s: {items}")


# Endpoints through the API ---------------------------------------------------------------------------


def test_endpoint_crud_secret_shown_once(service: Service, receiver: Receiver) -> None:
    with service.client() as client:
        created = create_endpoint(client, receiver.path(), description="ci")
        secret = created["secret"]
        assert secret.startswith("whsec_") and len(base64.b64decode(secret.removeprefix("whsec_"))) >= 24
        assert created["event_types"] == ["job.succeeded", "job.failed", "job.canceled"] and created["enabled"]
        read = client.get(f"/webhooks/{created['id']}").json()
        assert "secret" not in read and secret not in json.dumps(read)
        assert secret not in client.get("/webhooks").text
        assert [w["id"] for w in client.get("/webhooks").json()["items"]] == [created["id"]]
        patched = client.patch(f"/webhooks/{created['id']}", json={"event_types": ["job.failed"]}).json()
        assert patched["event_types"] == ["job.failed"]
        body = assert_problem(client.patch(f"/webhooks/{created['id']}", json={"url": "ftp://x.org/"}), 422, "url")
        assert body["errors"][0]["field"] == "url"
        body = assert_problem(client.post("/webhooks", json={"url": receiver.path(), "event_types": ["job.done"]}), 422)
        assert body["errors"][0]["field"] == "event_types.0"
        with service.client() as stranger:
            assert_problem(stranger.get(f"/webhooks/{created['id']}"), 404, "not found")
            assert_problem(stranger.delete(f"/webhooks/{created['id']}"), 404, "not found")
        assert client.delete(f"/webhooks/{created['id']}").status_code == 204
        assert_problem(client.get(f"/webhooks/{created['id']}"), 404, "not found")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://127.0.0.2/",
    ],
)
def test_private_targets_are_refused_at_creation(service: Service, project: dict, url: str) -> None:
    with service.client(project["key"]) as client:
        body = assert_problem(client.post("/webhooks", json={"url": url}), 422, "may not reach")
        assert body["errors"] == [{"field": "url", "message": body["errors"][0]["message"]}]
        job = {"model_id": project["model_id"], "dataset_id": project["dataset_id"], "webhook_url": url}
        body = assert_problem(client.post("/jobs", json=job), 422, "may not reach")
        assert body["errors"][0]["field"] == "webhook_url"
        job["webhook_url"] = "file:///etc/passwd"
        body = assert_problem(client.post("/jobs", json=job), 422)
        assert body["errors"][0]["field"] == "webhook_url"
        assert client.get("/webhooks").json()["items"] == []


def test_target_is_checked_again_at_delivery(service: Service, project: dict) -> None:
    # An endpoint saved while its name pointed somewhere public, now pointing at a private address
    # (DNS changed): written straight to the database, since the API would refuse it.
    with session_scope(service.database_url) as session:
        project_id = keys.project_for_key(session=session, key=project["key"]).id
        endpoint = webhooks.create_endpoint(
            session=session, project_id=project_id, url="http://10.255.255.1/hook", event_types=["job.failed"]
        )
        endpoint_id = endpoint.id
    with service.client(project["key"]) as client:
        assert client.post(f"/webhooks/{endpoint_id}/test").status_code == 202
        delivery = wait_delivery(client, f"/webhooks/{endpoint_id}/deliveries", lambda d: d["attempt_log"])
        attempt = delivery["attempt_log"][0]
        assert attempt["status_code"] is None and "refused" in attempt["error"] and "private" in attempt["error"]
        client.delete(f"/webhooks/{endpoint_id}")


# Delivery ------------------------------------------------------------------------------------------


def test_one_signed_delivery_per_terminal_job(service: Service, project: dict, receiver: Receiver) -> None:
    with service.client(project["key"]) as client:
        every = create_endpoint(client, receiver.path())
        only_failed = create_endpoint(client, receiver.path(), event_types=["job.failed"])
        disabled = create_endpoint(client, receiver.path())
        off = client.patch(f"/webhooks/{disabled['id']}", json={"enabled": False}).json()
        assert off["enabled"] is False and off["disabled_reason"]
        assert_problem(client.post(f"/webhooks/{disabled['id']}/test"), 409, "disabled")
        one_off_url = receiver.path()
        jobs = []
        for _ in range(2):
            response = client.post(
                "/jobs",
                json={"model_id": project["model_id"], "dataset_id": project["dataset_id"], "webhook_url": one_off_url},
            )
            assert response.status_code == 202, response.text
            jobs.append(response.json())
        assert jobs[0]["webhook_url"] == one_off_url and jobs[0]["webhook_secret"].startswith("whsec_")
        assert "webhook_secret" not in client.get(f"/jobs/{jobs[0]['id']}").json()
        client.post(f"/jobs/{jobs[1]['id']}/cancel")  # canceled while queued, or stopped while running
        finals = {job["id"]: _wait_terminal(client, job["id"]) for job in jobs}

        received = receiver.wait(every["url"], 2)
        one_off = receiver.wait(one_off_url, 2)
        time.sleep(3 * LATE)  # nothing more may arrive: no duplicates
        assert len(receiver.at(every["url"])) == 2 and len(receiver.at(one_off_url)) == 2
        assert receiver.at(disabled["url"]) == []
        expected_failed = sum(status == "failed" for status in finals.values())
        assert len(receiver.at(only_failed["url"])) == expected_failed

        by_job = {}
        for request in received:
            payload = request.verify(every["secret"])
            assert payload == json.loads(request.body)
            by_job[payload["data"]["job_id"]] = payload
            with pytest.raises(WebhookVerificationError):
                request.verify(jobs[0]["webhook_secret"])  # endpoints and one-off URLs have their own secrets
        assert set(by_job) == set(finals)
        for job_id, payload in by_job.items():
            status = finals[job_id]
            assert payload["type"] == f"job.{status}" and payload["data"]["status"] == status
            assert payload["data"]["model"]["id"] == project["model_id"]
            assert payload["data"]["links"]["job"].endswith(f"/api/v1/jobs/{job_id}")
            assert (payload["data"]["links"]["report"] is not None) == (status == "succeeded")
            assert "secret" not in json.dumps(payload)
        # Each job's one-off webhook is signed with that job's own secret, and only with it.
        announced = []
        for request in one_off:
            signers = [job for job in jobs if _signed_by(request, job["webhook_secret"])]
            assert len(signers) == 1
            assert request.verify(signers[0]["webhook_secret"])["data"]["job_id"] == signers[0]["id"]
            announced.append(signers[0]["id"])
        assert sorted(announced) == sorted(finals)

        # Every attempt is logged: one 200 per delivery, with its latency and the answer's start.
        deliveries = client.get(f"/webhooks/{every['id']}/deliveries").json()["items"]
        assert len(deliveries) == 2 and all(d["status"] == "succeeded" and d["attempts"] == 1 for d in deliveries)
        attempt = deliveries[0]["attempt_log"][0]
        assert attempt["status_code"] == 200 and attempt["latency_ms"] > 0 and attempt["response"] == "answer 200"
        for_job = client.get("/webhooks/deliveries", params={"job_id": jobs[0]["id"]}).json()["items"]
        assert {d["endpoint_id"] for d in for_job} >= {every["id"], None}  # None: the one-off URL

        # A one-off delivery can be replayed too: same webhook-id, same job secret.
        first = next(d for d in for_job if d["endpoint_id"] is None)
        assert client.post(f"/webhooks/deliveries/{first['id']}/replay").status_code == 202
        again = receiver.wait(one_off_url, 3)[-1]
        assert again.webhook_id == first["webhook_id"] and again.verify(jobs[0]["webhook_secret"])


def test_retries_with_growing_gaps_same_id_then_replay(service: Service, receiver: Receiver) -> None:
    with service.client() as client:
        url = receiver.path(500, 500, 500, 200)
        endpoint = create_endpoint(client, url)
        ping = client.post(f"/webhooks/{endpoint['id']}/test")
        assert ping.status_code == 202 and ping.json()["event_type"] == "webhook.ping"
        requests = receiver.wait(url, 4, timeout=60)
        assert len({r.webhook_id for r in requests}) == 1, "webhook-id must be stable across retries"
        assert requests[0].webhook_id == ping.json()["webhook_id"]
        for request in requests:
            assert request.verify(endpoint["secret"])["type"] == "webhook.ping"
        timestamps = [int(r.headers["webhook-timestamp"]) for r in requests]
        assert timestamps == sorted(timestamps) and timestamps[-1] > timestamps[0]  # fresh per attempt
        gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(requests)]
        # Schedule 1, 3, 6 s with ±10 % jitter, plus up to LATE of polling delay.
        for gap, planned in zip(gaps, (1, 3, 6), strict=True):
            assert 0.9 * planned <= gap <= 1.1 * planned + LATE, (gaps, planned)
        assert gaps == sorted(gaps), gaps

        delivery = wait_delivery(client, f"/webhooks/{endpoint['id']}/deliveries", lambda d: d["status"] == "succeeded")
        assert [a["status_code"] for a in delivery["attempt_log"]] == [500, 500, 500, 200]
        assert delivery["attempts"] == 4 and delivery["webhook_id"] == requests[0].webhook_id

        replayed = client.post(f"/webhooks/{endpoint['id']}/deliveries/{delivery['id']}/replay")
        assert replayed.status_code == 202, replayed.text
        again = receiver.wait(url, 5)[-1]
        assert again.webhook_id == requests[0].webhook_id and again.verify(endpoint["secret"])
        listed = client.get(f"/webhooks/{endpoint['id']}/deliveries").json()["items"]
        assert len(listed) == 2 and listed[0]["id"] == replayed.json()["id"]
        other = service.client()
        assert_problem(other.post(f"/webhooks/{endpoint['id']}/deliveries/{delivery['id']}/replay"), 404)
        other.close()


def test_retry_after_is_honoured(service: Service, receiver: Receiver) -> None:
    with service.client() as client:
        url = receiver.path((503, {"Retry-After": "4"}), 200)
        endpoint = create_endpoint(client, url)
        client.post(f"/webhooks/{endpoint['id']}/test")
        first, second = receiver.wait(url, 2, timeout=30)
        assert 4.0 <= second.at - first.at <= 4.4 + LATE  # not the schedule's 1 s


def test_410_gone_disables_the_endpoint(service: Service, receiver: Receiver) -> None:
    with service.client() as client:
        url = receiver.path(410)
        endpoint = create_endpoint(client, url)
        client.post(f"/webhooks/{endpoint['id']}/test")
        receiver.wait(url, 1)
        deadline = time.monotonic() + 30
        while client.get(f"/webhooks/{endpoint['id']}").json()["enabled"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        read = client.get(f"/webhooks/{endpoint['id']}").json()
        assert "410" in read["disabled_reason"]
        assert_problem(client.post(f"/webhooks/{endpoint['id']}/test"), 409, "disabled")
        time.sleep(3 * LATE)
        assert len(receiver.at(url)) == 1, "a 410 is final: no retries"
        # Enabling it again is the user's decision; it then receives again.
        assert client.patch(f"/webhooks/{endpoint['id']}", json={"enabled": True}).json()["disabled_reason"] is None
        client.post(f"/webhooks/{endpoint['id']}/test")
        receiver.wait(url, 2)


def test_endpoint_failing_for_days_is_disabled(service: Service, receiver: Receiver) -> None:
    key = service.new_key()
    with service.client(key) as client:
        url = receiver.path(500, 500, 500, 500)
        endpoint = create_endpoint(client, url)
        with session_scope(service.database_url) as session:  # as if it had failed for six days already
            session.get(WebhookEndpoint, uuid.UUID(endpoint["id"])).failing_since = utcnow() - timedelta(days=6)
        client.post(f"/webhooks/{endpoint['id']}/test")
        delivery = wait_delivery(client, f"/webhooks/{endpoint['id']}/deliveries", lambda d: d["status"] == "failed")
        read = client.get(f"/webhooks/{endpoint['id']}").json()
        assert read["enabled"] is False and "failed for" in read["disabled_reason"], read
        assert delivery["attempts"] == 1 and "not sent" in delivery["last_error"]
        assert len(receiver.at(url)) == 1  # the retry due 1 s later was not sent to the disabled endpoint


def test_secret_rotation_signs_with_both_during_the_overlap(service: Service, receiver: Receiver) -> None:
    with service.client() as client:
        url = receiver.path()
        endpoint = create_endpoint(client, url)
        old = endpoint["secret"]
        rotated = client.post(f"/webhooks/{endpoint['id']}/rotate-secret", json={"overlap_seconds": 3600}).json()
        new = rotated["secret"]
        assert new != old and new.startswith("whsec_") and rotated["previous_secret_expires_at"]
        client.post(f"/webhooks/{endpoint['id']}/test")
        request = receiver.wait(url, 1)[0]
        signatures = request.headers["webhook-signature"].split(" ")
        assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
        request.verify(old)
        request.verify(new)

        newest = client.post(f"/webhooks/{endpoint['id']}/rotate-secret", json={"overlap_seconds": 0}).json()["secret"]
        client.post(f"/webhooks/{endpoint['id']}/test")
        request = receiver.wait(url, 2)[1]
        assert len(request.headers["webhook-signature"].split(" ")) == 1
        request.verify(newest)
        for stale in (old, new):
            with pytest.raises(WebhookVerificationError):
                request.verify(stale)


def test_redirects_are_not_followed(service: Service, receiver: Receiver) -> None:
    with service.client() as client:
        elsewhere = receiver.path()
        url = receiver.path((307, {"Location": elsewhere}), 200)
        endpoint = create_endpoint(client, url)
        client.post(f"/webhooks/{endpoint['id']}/test")
        receiver.wait(url, 2)
        delivery = wait_delivery(client, f"/webhooks/{endpoint['id']}/deliveries", lambda d: d["status"] == "succeeded")
        first = delivery["attempt_log"][0]
        assert first["status_code"] == 307 and "not followed" in first["error"]
        assert receiver.at(elsewhere) == []


def test_outbox_commits_with_the_terminal_state_or_not_at_all(
    service: Service, project: dict, receiver: Receiver
) -> None:
    """The reaper's path (finish_job without an owner) and cancel-while-queued, at the query level."""
    key = service.new_key()
    with service.client(key) as client:
        endpoint = create_endpoint(client, receiver.path())
    with session_scope(service.database_url) as session:
        project_id = keys.project_for_key(session=session, key=key).id
        job_ids = [
            queries.create_job(
                session=session,
                project_id=project_id,
                model_id=uuid.UUID(project["model_id"]),
                dataset_id=uuid.UUID(project["dataset_id"]),
                recipe={},
            ).id
            for _ in range(2)
        ]  # never enqueued: no worker runs them
    with session_scope(service.database_url) as session:
        assert queries.claim_job(
            session=session, job_id=job_ids[0], worker_id="lost-host:1", heartbeat_timeout=60, max_attempts=3
        )

    def messages(session, job_id: uuid.UUID) -> list[WebhookMessage]:
        return list(session.scalars(select(WebhookMessage).where(WebhookMessage.job_id == job_id)))

    with session_scope(service.database_url) as session:  # the job ends, then the transaction is lost
        ended = queries.finish_job(
            session=session, job_id=job_ids[0], worker_id=None, status=JobStatus.failed, error="worker lost"
        )
        assert ended and len(messages(session, job_ids[0])) == 1
        session.rollback()
    with session_scope(service.database_url) as session:
        assert queries.get_job_unscoped(session=session, job_id=job_ids[0]).status == JobStatus.running
        assert messages(session, job_ids[0]) == []  # no announcement for a job that did not end
        queries.finish_job(
            session=session, job_id=job_ids[0], worker_id=None, status=JobStatus.failed, error="worker lost"
        )
    with session_scope(service.database_url) as session:
        queries.request_cancel(session=session, job=queries.get_job_unscoped(session=session, job_id=job_ids[1]))
    with session_scope(service.database_url) as session:
        # A terminal job cannot end again, so it cannot be announced twice.
        assert not queries.finish_job(session=session, job_id=job_ids[0], worker_id=None, status=JobStatus.failed)
        assert [len(messages(session, job_id)) for job_id in job_ids] == [1, 1]
    received = receiver.wait(endpoint["url"], 2)
    payloads = {p["data"]["job_id"]: p for p in (r.verify(endpoint["secret"]) for r in received)}
    assert payloads[str(job_ids[0])]["type"] == "job.failed"
    assert payloads[str(job_ids[0])]["data"]["error"] == "worker lost"
    assert payloads[str(job_ids[1])]["type"] == "job.canceled"


# A worker dies -------------------------------------------------------------------------------------


def test_worker_killed_before_delivery_still_delivers_exactly_once(
    service: Service, project: dict, receiver: Receiver
) -> None:
    """The webhook worker dies; the job ends meanwhile; the outbox row waits; a new worker sends it once."""
    with service.client(project["key"]) as client:
        url = receiver.path()
        endpoint = create_endpoint(client, url)
        service.stack.kill("default")  # SIGKILL: the poller (beat) and the delivery tasks are gone
        try:
            job = client.post("/jobs", json={"model_id": project["model_id"], "dataset_id": project["dataset_id"]})
            assert job.status_code == 202, job.text
            status = _wait_terminal(client, job.json()["id"])
            pending = client.get("/webhooks/deliveries", params={"job_id": job.json()["id"]}).json()["items"]
            assert [d["status"] for d in pending if d["endpoint_id"] == endpoint["id"]] == ["pending"]
            time.sleep(2 * LATE)
            assert receiver.at(url) == []
        finally:
            service.start_default_worker()
        request = receiver.wait(url, 1, timeout=90)[0]
        time.sleep(4 * LATE)
        assert len(receiver.at(url)) == 1, "delivered more than once"
        payload = request.verify(endpoint["secret"])
        assert payload["type"] == f"job.{status}" and payload["data"]["job_id"] == job.json()["id"]


def test_worker_killed_during_an_attempt_sends_again_with_the_same_id(service: Service, receiver: Receiver) -> None:
    """At least once: the attempt a dead worker was making is made again once its lease expires."""
    with service.client() as client:
        url = receiver.path((200, {}, 1.5))  # the first answer is slow: the worker dies waiting for it
        endpoint = create_endpoint(client, url)
        client.post(f"/webhooks/{endpoint['id']}/test")
        receiver.wait(url, 1)
        service.stack.kill("default")
        killed_at = time.monotonic()
        service.start_default_worker()
        requests = receiver.wait(url, 2, timeout=90)
        # The lease is 4 x 2 s + 15 s in the test service; the new worker waits it out before resending.
        assert requests[1].at - killed_at >= 20
        assert requests[1].webhook_id == requests[0].webhook_id
        assert requests[1].verify(endpoint["secret"])["type"] == "webhook.ping"
        delivery = wait_delivery(client, f"/webhooks/{endpoint['id']}/deliveries", lambda d: d["status"] == "succeeded")
        # The dead worker's attempt left no log entry: it never learnt the outcome.
        assert [a["status_code"] for a in delivery["attempt_log"]] == [200]
        time.sleep(2 * LATE)
        assert len(receiver.at(url)) == 2
