"""How the API serves the built dashboard: SPA fallback for page paths, never for API paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import dashboard
from api.dashboard import mount_dashboard
from api.main import API_PREFIX, create_app


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    (tmp_path / "assets").mkdir()
    (tmp_path / "index.html").write_text("<!doctype html><title>dashboard</title>")
    (tmp_path / "assets" / "index-abc123.js").write_text("console.log('hi')")
    return tmp_path


@pytest.fixture
def client(dist: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setattr(dashboard, "DIST", dist)
    return TestClient(create_app())


def test_pages_get_index_html_and_assets_are_immutable(client: TestClient) -> None:
    for path in ("/", "/jobs", "/jobs/2b1e0b8e-1d7c-4b7e-9a43-2f4f6c1e7d10", "/models/x/compare"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert "dashboard" in response.text
        assert response.headers["cache-control"] == "no-cache"
    asset = client.get("/assets/index-abc123.js")
    assert asset.status_code == 200 and "immutable" in asset.headers["cache-control"]
    assert client.get("/assets/missing.js").status_code == 404


def test_api_and_docs_are_not_shadowed(client: TestClient) -> None:
    assert client.get(f"{API_PREFIX}/openapi.json").json()["info"]["title"]
    assert client.get("/docs").status_code == 200
    assert client.get(f"{API_PREFIX}/health").json()["status"] == "ok"
    for path in (f"{API_PREFIX}/no-such-route", "/api/v2/jobs", "/api"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.headers["content-type"] == "application/problem+json"
    assert client.get(f"{API_PREFIX}/jobs").status_code == 401  # still the API, still wants a key


def test_no_traversal_out_of_the_build(client: TestClient, dist: Path) -> None:
    (dist.parent / "secret.txt").write_text("nope")
    response = client.get("/..%2Fsecret.txt")
    assert "nope" not in response.text


def test_routes_added_after_the_dashboard_are_not_shadowed(dist: Path) -> None:
    app = FastAPI()
    mount_dashboard(app, dist)

    @app.get("/late")
    def late() -> dict:
        return {"late": True}

    client = TestClient(app)
    assert client.get("/late").json() == {"late": True}
    assert "dashboard" in client.get("/elsewhere").text


def test_nothing_is_mounted_without_a_build(tmp_path: Path) -> None:
    app = FastAPI()
    mount_dashboard(app, tmp_path / "missing")
    assert TestClient(app).get("/").status_code == 404
