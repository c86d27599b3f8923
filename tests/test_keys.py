"""API keys: listed without their secret, created once, revoked with immediate effect (API and admin CLI)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from tests.conftest import Service
from tests.test_api import assert_problem


def _quant_admin(service: Service, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jobs.admin", *args], env=service.stack.env, capture_output=True, text=True, timeout=60
    )


def test_keys_are_listed_created_and_revoked(service: Service) -> None:
    first = service.new_key()
    with service.client(first) as client:
        created = client.post("/keys", json={"name": "ci"})
        assert created.status_code == 201, created.text
        second = created.json()
        assert second["key"].startswith("qk_") and second["key"].startswith(second["prefix"])
        assert second["name"] == "ci" and second["last_used_at"] is None and second["revoked_at"] is None

        with service.client(second["key"]) as other:
            assert other.get("/jobs").status_code == 200
        listing = client.get("/keys")
        assert listing.status_code == 200
        assert second["key"] not in listing.text and first not in listing.text  # never the secret again
        rows = {row["id"]: row for row in listing.json()}
        assert len(rows) == 2 and all(
            set(row) == {"id", "name", "prefix", "created_at", "last_used_at", "revoked_at"} for row in rows.values()
        )
        assert rows[second["id"]]["last_used_at"] is not None  # the request above stamped it

        assert client.delete(f"/keys/{second['id']}").status_code == 204
        # Immediately: the very next request with the revoked key is refused.
        assert_problem(httpx.get(f"{service.url}/api/v1/jobs", headers={"X-API-Key": second["key"]}), 401, "revoked")
        assert client.get("/jobs").status_code == 200  # the other key is untouched
        revoked = {row["id"]: row for row in client.get("/keys").json()}[second["id"]]
        assert revoked["revoked_at"] is not None
        assert client.delete(f"/keys/{second['id']}").status_code == 204  # idempotent
        assert {row["id"]: row for row in client.get("/keys").json()}[second["id"]]["revoked_at"] == revoked[
            "revoked_at"
        ]
        assert_problem(client.delete("/keys/00000000-0000-0000-0000-000000000000"), 404, "not found")


def test_a_key_can_revoke_itself(service: Service) -> None:
    key = service.new_key()
    with service.client(key) as client:
        own = client.get("/keys").json()[0]
        assert client.delete(f"/keys/{own['id']}").status_code == 204
        assert_problem(client.get("/keys"), 401, "revoked")


def test_quant_admin_lists_and_revokes_keys(service: Service) -> None:
    project = f"admin-{time.monotonic_ns()}"
    key = service.new_key(project)
    listed = _quant_admin(service, "list-keys", "--project", project)
    assert listed.returncode == 0, listed.stderr
    assert key[:10] in listed.stdout and key not in listed.stdout and "last used never" in listed.stdout

    missing = _quant_admin(service, "revoke-key", "--project", project, "--prefix", "qk_doesnotexist")
    assert missing.returncode == 2 and "0 keys" in missing.stderr

    revoked = _quant_admin(service, "revoke-key", "--project", project, "--prefix", key[:10])
    assert revoked.returncode == 0, revoked.stderr
    assert_problem(httpx.get(f"{service.url}/api/v1/jobs", headers={"X-API-Key": key}), 401, "revoked")
    assert "REVOKED" in _quant_admin(service, "list-keys", "--project", project).stdout
