"""Request dependencies as `Annotated` aliases: settings, DB session, the caller's project, Celery.

All are `async def`. FastAPI runs a plain `def` dependency in its thread pool, a hop that costs more
CPU than most dependencies do (about 60 us per hop here, `bench.request_cpu`): those that do no I/O
run on the event loop, and those that block (the key lookup, the session's commit and close) send
just that work to the thread pool, once each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio.to_thread
from celery import Celery
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.problems import Problem
from jobs import keys
from jobs.config import Settings
from jobs.db import get_sessionmaker
from jobs.keys import KeyProject


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def _end(session: Session, commit: bool) -> None:
    try:
        if commit:
            session.commit()
        else:
            session.rollback()
    finally:
        session.close()


async def get_session(request: Request) -> AsyncIterator[Session]:
    """The request's session (as `jobs.db.session_scope`): committed when the route returns, rolled back
    when anything raises, closed either way. Its scope is the route function, not the request: a
    request-scoped end runs after the response is sent, so a client could read, in its next request,
    the state before the write just acknowledged (a canceled job still holding its quota slot).
    Creating it does no I/O (it connects at its first statement), so only its end goes to a thread:
    under a limiter of its own, as FastAPI ends a sync dependency, so that a request can give its
    connection back while every thread-pool token is held by requests waiting for a connection
    (FastAPI also shields this end from the request's cancellation)."""
    session = get_sessionmaker(request.app.state.settings.resolved_database_url)()
    commit = False
    try:
        yield session
        commit = True
    finally:
        await anyio.to_thread.run_sync(_end, session, commit, limiter=anyio.CapacityLimiter(1))


SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="A project's API key.")


async def get_project(session: SessionDep, api_key: Annotated[str | None, Security(_api_key_header)]) -> KeyProject:
    """The project of the request's key, read from the database on every request (a revoked key fails
    from the next request on); `project_for_key` commits its once-a-minute `last_used_at` mark."""
    if not api_key:
        raise Problem(401, "missing X-API-Key header", slug="missing-api-key", headers={"WWW-Authenticate": "ApiKey"})
    project = await run_in_threadpool(keys.project_for_key, session=session, key=api_key)
    if project is None:
        raise Problem(401, "unknown or revoked API key", slug="invalid-api-key", headers={"WWW-Authenticate": "ApiKey"})
    return project


ProjectDep = Annotated[KeyProject, Depends(get_project)]


async def get_celery(request: Request) -> Celery:
    return request.app.state.celery


CeleryDep = Annotated[Celery, Depends(get_celery)]
