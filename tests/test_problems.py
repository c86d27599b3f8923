"""Errors the framework would answer by itself are problem+json too: Range refusals on downloads,
undecodable JSON bodies (named as the body, not by a byte offset), and `/openapi.json` at the root
(the document, never the dashboard's fallback page). In-process apps, no services needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from api import dashboard, problems
from api.downloads import ArtifactResponse
from api.main import API_PREFIX, create_app
from tests.test_api import PROBLEM


class _Body(BaseModel):
    name: str


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    (tmp_path / "artifact.bin").write_bytes(bytes(range(100)))
    app = FastAPI()
    problems.install(app)

    @app.get("/artifact")
    def artifact() -> ArtifactResponse:
        return ArtifactResponse(tmp_path / "artifact.bin")

    @app.post("/things")
    def create(body: _Body) -> dict:
        return {"name": body.name}

    return TestClient(app)


def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["status"] == status and body["detail"]
    return body


def test_range_refusals_are_problems_naming_the_header(client: TestClient) -> None:
    assert client.get("/artifact", headers={"Range": "bytes=10-19"}).content == bytes(range(10, 20))
    backwards = _problem(client.get("/artifact", headers={"Range": "bytes=50-10"}), 400)
    assert backwards["errors"] == [{"field": "header.range", "message": "start must be less than end"}]
    _problem(client.get("/artifact", headers={"Range": "items=0-1"}), 400)
    past_end = _problem(client.get("/artifact", headers={"Range": "bytes=500-600"}), 416)
    assert past_end["errors"][0]["field"] == "header.range"
    assert "100 bytes" in past_end["detail"]
    assert client.get("/artifact", headers={"Range": "bytes=500-600"}).headers["content-range"] == "bytes */100"


def test_an_undecodable_json_body_is_named_as_the_body(client: TestClient) -> None:
    response = client.post("/things", content=b'{"name": ', headers={"Content-Type": "application/json"})
    [error] = _problem(response, 422)["errors"]
    assert error["field"] == "(body)"
    assert error["message"].startswith("not valid JSON at byte 9")


def test_openapi_json_at_the_root_leads_to_the_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "index.html").write_text("<!doctype html><title>dashboard</title>")
    monkeypatch.setattr(dashboard, "DIST", tmp_path)
    app = TestClient(create_app())
    redirect = app.get("/openapi.json", follow_redirects=False)
    assert redirect.status_code == 308 and redirect.headers["location"] == f"{API_PREFIX}/openapi.json"
    assert app.get("/openapi.json").json()["openapi"].startswith("3.")
