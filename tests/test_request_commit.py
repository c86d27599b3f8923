"""A write is committed before its response leaves: a client that reads right after an acknowledged
write sees it. On SQLite and PostgreSQL, in-process app (no worker or broker needed).

The spy reads the job's row from its own connection at the moment the response's first message is
sent, which is the last moment the API can still be holding the write uncommitted.
"""

from __future__ import annotations

import uuid

import anyio.to_thread
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.main import API_PREFIX, create_app
from jobs import keys, queries
from jobs.config import Settings
from jobs.db import session_scope
from jobs.models import Job
from samples.rows import placeholder_job


def _queued_job(url: str) -> tuple[str, uuid.UUID]:
    with session_scope(url) as session:
        project = queries.create_project(session=session, name=f"commit-{uuid.uuid4().hex[:8]}")
        _, key = keys.create_api_key(session=session, project_id=project.id)
        (job_id,) = placeholder_job(session=session, project_id=project.id, recipe={})
        return key, job_id


def _status(url: str, job_id: uuid.UUID) -> str:
    with session_scope(url) as session:
        return session.get(Job, job_id).status.value


def _spying(app: ASGIApp, url: str, job_id: uuid.UUID, seen: list[str]) -> ASGIApp:
    async def spied(scope: Scope, receive: Receive, send: Send) -> None:
        async def spy(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen.append(await anyio.to_thread.run_sync(_status, url, job_id))
            await send(message)

        await app(scope, receive, spy)

    return spied


def test_a_cancel_is_committed_before_its_response_is_sent(database: str) -> None:
    key, job_id = _queued_job(database)
    seen: list[str] = []
    app = create_app(Settings(database_url=database, environment="test"))
    with TestClient(_spying(app, database, job_id, seen)) as client:
        response = client.post(f"{API_PREFIX}/jobs/{job_id}/cancel", headers={"X-API-Key": key})
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "canceled"
    assert seen == ["canceled"]  # the database said so before the client could hear it
