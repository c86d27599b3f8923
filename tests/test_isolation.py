"""Every route of the OpenAPI document, tried without a key and with another project's key.

Routes are enumerated from the service's own OpenAPI document, so a route added later is covered
without touching this file, or makes it fail until it says how to call the route:

(a) without `X-API-Key` every route but the public probes answers 401 problem+json;
(b) project B's key with project A's ids answers 404 problem+json on every route that takes an id
    (never 403: a foreign id must look exactly like an id that does not exist), and no answer B
    gets anywhere contains any of A's ids;
(c) afterwards A's resources are all still there and A's key still works.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from samples.tiny import tiny_conv_bytes
from tests.conftest import Service
from tests.test_api import PROBLEM, _wait_terminal, tiny_dataset

PUBLIC = {("get", "/api/v1/health"), ("get", "/api/v1/ready")}
FAST_RECIPE = {"deploy": {"cpu_latency": False, "tensorrt_engine": False}}


@pytest.fixture(scope="module")
def owned(service: Service) -> dict:
    """Project A with one of everything; returns its key and the id for every path parameter."""
    key = service.new_key()
    model, dataset = service.upload(key, tiny_conv_bytes(), tiny_dataset())
    with service.client(key) as client:
        job = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"], "recipe": FAST_RECIPE})
        assert job.status_code == 202, job.text
        assert _wait_terminal(client, job.json()["id"]) == "succeeded"
        webhook = client.post("/webhooks", json={"url": "http://127.0.0.1:9/a"}).json()
        delivery = client.post(f"/webhooks/{webhook['id']}/test").json()
        api_key = client.get("/keys").json()[0]
    ids = {
        "model_id": model["id"],
        "dataset_id": dataset["id"],
        "job_id": job.json()["id"],
        "name": "report.json",  # exists for A's job
        "webhook_id": webhook["id"],
        "delivery_id": delivery["id"],
        "key_id": api_key["id"],
    }
    return {"key": key, "ids": ids}


def _routes(service: Service) -> list[tuple[str, str, dict]]:
    spec = httpx.get(f"{service.url}/api/v1/openapi.json").json()
    routes = [(method, path, op) for path, item in spec["paths"].items() for method, op in item.items()]
    assert len(routes) > 20 and {(m, p) for m, p, _ in routes} >= PUBLIC, "the public probes moved: update PUBLIC"
    return routes


def _call(client: httpx.Client, base: str, method: str, path: str, ids: dict, body: dict | None) -> httpx.Response:
    def fill(match: re.Match) -> str:
        name = match.group(1)
        assert name in ids, f"{path}: add an id owned by project A for the path parameter '{name}'"
        return ids[name]

    url = re.sub(r"\{([^}]+)\}", fill, path)
    return client.request(method.upper(), base + url, json=body)  # absolute: the client's base_url is unused


def _bodies(ids: dict) -> dict[tuple[str, str], dict]:
    """A valid body for routes that require one; those naming A's ids must still get 404."""
    return {
        ("post", "/api/v1/jobs"): {"model_id": ids["model_id"], "dataset_id": ids["dataset_id"]},
        ("patch", "/api/v1/webhooks/{webhook_id}"): {"description": "taken over"},
        ("post", "/api/v1/webhooks"): {"url": "http://127.0.0.1:9/b"},
    }


def test_every_route_without_a_key_is_401(service: Service, owned: dict) -> None:
    """No key, and a well-formed key that does not exist: 401 problem+json before anything else runs."""
    forged = {"X-API-Key": "qk_" + "x" * 43}
    with (
        httpx.Client(base_url=service.url, timeout=60) as anonymous,
        httpx.Client(base_url=service.url, headers=forged, timeout=60) as impostor,
    ):
        for method, path, _op in _routes(service):
            if (method, path) in PUBLIC:
                continue
            for client in (anonymous, impostor):
                response = _call(client, service.url, method, path, owned["ids"], None)
                assert response.status_code == 401, (method, path, response.status_code, response.text)
                assert response.headers["content-type"].startswith(PROBLEM), (method, path)
                assert response.headers.get("www-authenticate") == "ApiKey", (method, path)


def test_another_projects_ids_are_404_everywhere(service: Service, owned: dict) -> None:
    ids = owned["ids"]
    bodies = _bodies(ids)
    foreign_body = {("post", "/api/v1/jobs")}
    a_values = [value for name, value in ids.items() if name != "name"] + [owned["key"][:10]]
    checked = 0
    with service.client() as intruder:  # project B
        for method, path, _op in _routes(service):
            if (method, path) in PUBLIC:
                continue
            body = bodies.get((method, path))
            body_text = json.dumps(body)
            response = _call(intruder, service.url, method, path, ids, body)
            assert response.status_code < 500, (method, path, response.text)
            sent = f"{response.request.url} {body_text}"  # echoing the caller's own ids back is no leak
            leaked = [value for value in a_values if value in response.text and value not in sent]
            assert not leaked, (method, path, leaked, response.text[:500])
            if "{" in path or (method, path) in foreign_body:
                assert response.status_code == 404, (method, path, response.status_code, response.text)
                assert response.headers["content-type"].startswith(PROBLEM), (method, path)
                checked += 1
    assert checked >= 15  # every id-bearing route was exercised, not skipped

    with service.client(owned["key"]) as owner:  # nothing of A's was changed by B's attempts
        for path in (
            f"/models/{ids['model_id']}",
            f"/datasets/{ids['dataset_id']}",
            f"/jobs/{ids['job_id']}/report",
            f"/webhooks/{ids['webhook_id']}/deliveries/{ids['delivery_id']}",
        ):
            assert owner.get(path).status_code == 200, path
        webhook = owner.get(f"/webhooks/{ids['webhook_id']}").json()
        assert webhook["description"] == "" and webhook["enabled"]
        key_row = {row["id"]: row for row in owner.get("/keys").json()}[ids["key_id"]]
        assert key_row["revoked_at"] is None
        assert owner.get(f"/jobs/{ids['job_id']}").json()["status"] == "succeeded"
