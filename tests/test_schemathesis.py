"""Property-based fuzzing of the live API against its own OpenAPI document (schemathesis).

Every operation in `/api/v1/openapi.json` is called with generated valid and invalid inputs,
authenticated with a real key of a project that owns a real model, dataset and finished job (so
reads of existing ids are reachable too). Each response must:

- not be a server error (no 5xx),
- have a status code, content type, headers and body the document declares for that operation.

The run is bounded (`MAX_EXAMPLES` per operation, no deadline) to stay under two minutes on two
cores; it runs against the SQLite service only (the schema and handlers are the same on PostgreSQL).
"""

from __future__ import annotations

import time

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import Service
from tests.test_api import _wait_terminal

pytestmark = pytest.mark.e2e

MAX_EXAMPLES = 15
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzzed_project(service: Service, digits) -> dict:
    if service.kind != "sqlite":
        pytest.skip("fuzzed once, against the SQLite service")
    model_path, data_path = digits
    key = service.new_key()
    model, dataset = service.upload(key, model_path.read_bytes(), data_path.read_bytes())
    with service.client(key) as client:
        job = client.post("/jobs", json={"model_id": model["id"], "dataset_id": dataset["id"]})
        assert job.status_code == 202, job.text
        _wait_terminal(client, job.json()["id"])  # so its event stream ends instead of following a live job
    return {"key": key, "model": model, "dataset": dataset, "job": job.json()}


def test_api_conforms_to_its_openapi_document(service: Service, fuzzed_project: dict) -> None:
    # Operations are walked here rather than through `@schema.parametrize()`: its fixture-based
    # loader needs pytest internals that pytest 9 removed (`Node._nodeid`).
    schema = schemathesis.openapi.from_url(f"{service.url}/api/v1/openapi.json")
    headers = {"X-API-Key": fuzzed_project["key"]}
    failures: dict[str, str] = {}
    started = time.monotonic()
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                suppress_health_check=list(hypothesis.HealthCheck),
                derandomize=True,  # the same cases on every run: a failure here is reproducible
                phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],  # no shrinking: bounded time
                database=None,
            )
            def call(case) -> None:
                case.call_and_validate(base_url=service.url, headers=headers, checks=CHECKS, timeout=30)

            try:
                call()
            except hypothesis.errors.Unsatisfiable:
                assert mode == GenerationMode.NEGATIVE, operation.path  # nothing to break in a parameterless call
            except (Exception, BaseExceptionGroup) as exc:  # one failing operation must not hide the others
                failures[f"{operation.method.upper()} {operation.path} ({mode.value})"] = str(exc)[:2000]
    assert operations >= 20, f"only {operations} operations found in the document"
    print(f"schemathesis: {operations} operations in {time.monotonic() - started:.0f} s")
    assert not failures, "\n\n".join(f"{name}:\n{text}" for name, text in failures.items())
