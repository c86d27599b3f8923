"""API keys: listed without their secret, created once, revoked with immediate effect (API and admin CLI)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta

import httpx
from sqlalchemy import select, update

from jobs import keys
from jobs.db import session_scope
from jobs.models import ApiKey, utcnow
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


def test_key_lookup_marks_use_at_most_once_per_resolution(service: Service) -> None:
    # At the query level: `last_used_at` is written (and committed) on the first use and then only when
    # it is LAST_USED_RESOLUTION old; the key is read on every call, so a revocation holds at once.
    plaintext = service.new_key()
    key_hash = keys.hash_key(plaintext)

    def stored_last_used() -> datetime | None:
        with session_scope(service.database_url) as session:
            return session.scalar(select(ApiKey.last_used_at).where(ApiKey.key_hash == key_hash))

    with session_scope(service.database_url) as session:
        project = keys.project_for_key(session=session, key=plaintext)
        assert project is not None and not session.in_transaction()  # the mark is committed already
    first = stored_last_used()
    assert first is not None
    with session_scope(service.database_url) as session:
        assert keys.project_for_key(session=session, key=plaintext) == project
    assert stored_last_used() == first  # within the resolution: not written again

    earlier = first - keys.LAST_USED_RESOLUTION - timedelta(seconds=1)
    with session_scope(service.database_url) as session:
        session.execute(update(ApiKey).where(ApiKey.key_hash == key_hash).values(last_used_at=earlier))
    with session_scope(service.database_url) as session:
        keys.project_for_key(session=session, key=plaintext)
    assert stored_last_used() > first  # a resolution later: written again

    with session_scope(service.database_url) as session:
        session.execute(update(ApiKey).where(ApiKey.key_hash == key_hash).values(revoked_at=utcnow()))
    with session_scope(service.database_url) as session:
        assert keys.project_for_key(session=session, key=plaintext) is None
        assert keys.project_for_key(session=session, key="qk_" + "x" * 43) is None
